"""The files speech recognition reads beside its graphs."""

from __future__ import annotations

from anyformer_onnx.media.processor_files import PREPROCESSOR_CONFIG

#: What speech recognition reads beside its graphs: the log-mel settings, the tokenizer, the prompt tokens.
SPEECH_FILES = (PREPROCESSOR_CONFIG, "tokenizer.json", "generation_config.json")
