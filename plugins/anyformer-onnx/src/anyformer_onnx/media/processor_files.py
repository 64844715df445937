"""The files a repo keeps its image and audio processors' settings in."""

from __future__ import annotations

#: The file every vision task reads its resize, crop and normalisation from.
PREPROCESSOR_CONFIG = "preprocessor_config.json"
#: A processor's settings as transformers 5 saves them: its feature extractor nested inside.
PROCESSOR_CONFIG = "processor_config.json"
