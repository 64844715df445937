"""Reading a model's config.json: bounded in size, a JSON object, or ``BAD_MODEL`` naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.files._byte_source import read_file_prefix

#: The largest config.json read: real ones are a few KiB.
MAX_CONFIG_BYTES = 16 * 2**20


def read_config_json(path: Path, label: str) -> dict[str, Any]:
    """Parse ``path`` as a config object; ``label`` names it in messages (``config.json of org/x``)."""
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label} is over {MAX_CONFIG_BYTES // 2**20} MiB; not a config")
        # Opened as a regular file or not at all: a FIFO named config.json must not block the reader.
        data = json.loads(read_file_prefix(path, MAX_CONFIG_BYTES + 1).decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{label} is not readable JSON: {exc}", cause=exc) from exc
    if not isinstance(data, dict):
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{label} is not a JSON object")
    return data
