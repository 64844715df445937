"""Where fused decoder graphs live under ``ANYFORMER_HOME``, and their listing for ``store_list``.

Kept free of numpy, onnx and onnxruntime: the ``store_list`` hook runs on every ``anyformer ls``.
The folders are written by :mod:`rewrite.fused_graph`.
"""

from __future__ import annotations

import json
from pathlib import Path

from anyformer.plugin import StoreEntry, anyformer_home
from anyformer_onnx import BACKEND_ID

GRAPH_NAME, DATA_NAME, RECORD_NAME = "model.onnx", "model.onnx.data", "fusion.json"
#: The folder level that holds one folder per fused graph (``…/<org>/<name>/fused/<key>``).
FUSED = "fused"
#: The owner folder of graphs fused from a local folder rather than a Hub repo.
LOCAL = "local"


def cache_folder(repo: str | None, key: str) -> Path:
    """``ANYFORMER_HOME/onnx/<org>/<name>/fused/<key>`` for a Hub repo, ``…/onnx/local/fused/<key>`` otherwise."""
    parts = repo.split("/") if repo else []
    # A repo id is two plain names; anything else (never expected from the store) is kept with the locals.
    plain = len(parts) == 2 and all(p not in ("", ".", "..", LOCAL) and "\\" not in p for p in parts)
    owner = Path(*parts) if plain else Path(LOCAL)
    return anyformer_home() / BACKEND_ID / owner / FUSED / key


def fused_entries() -> list[StoreEntry]:
    """One entry per fused graph under ``ANYFORMER_HOME/onnx``: its repo (or source graph), folder and bytes.

    Folders that record a graph left as exported (``fusion.json`` alone) are not models and are
    not listed; unreadable records are skipped.
    """
    root = anyformer_home() / BACKEND_ID
    if not root.is_dir():
        return []
    entries = []
    for record in sorted(root.glob(f"**/{FUSED}/*/{RECORD_NAME}")):
        folder = record.parent
        try:
            data = json.loads(record.read_text(encoding="utf-8"))
            size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or not data.get("fused") or not (folder / GRAPH_NAME).is_file():
            continue
        owner = folder.parent.parent.relative_to(root).as_posix()
        repo = str(data.get("source") or owner) if owner == LOCAL else owner
        entries.append(StoreEntry(backend=BACKEND_ID, repo=repo, revision=None, path=str(folder), bytes=size))
    return entries
