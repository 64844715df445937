"""Where anyformer keeps its own files."""

from __future__ import annotations

import os
from pathlib import Path


def anyformer_home() -> Path:
    """``ANYFORMER_HOME``, default ``~/.cache/anyformer``: backend-derived files live here (docs/contract.md)."""
    env = os.environ.get("ANYFORMER_HOME")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base).expanduser() if base else Path.home() / ".cache") / "anyformer"
