"""Where anyformer keeps its own files."""

from __future__ import annotations

import os
from pathlib import Path


def anyformer_home() -> Path:
    """``ANYFORMER_HOME``, else the user cache folder platformdirs names: backend-derived files live here
    (docs/contract.md). That is ``$XDG_CACHE_HOME/anyformer`` or ``~/.cache/anyformer`` on Linux,
    ``~/Library/Caches/anyformer`` on macOS and ``%LOCALAPPDATA%\\anyformer\\Cache`` on Windows."""
    env = os.environ.get("ANYFORMER_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs  # only where no ANYFORMER_HOME says it

    return platformdirs.user_cache_path("anyformer", appauthor=False)
