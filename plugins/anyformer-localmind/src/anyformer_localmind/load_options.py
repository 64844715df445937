"""LocalMind's load options: the schema the core parses ``Request.options`` with for it (``file`` only)."""

from __future__ import annotations

from anyformer.plugin import FILE_OPTION, LoadOptions

LOAD_OPTIONS = LoadOptions(FILE_OPTION)
