"""``pull``: fetch into the store the files the chosen backend would load, before any load.

The backend is chosen by the selection policy (or named), exactly as ``load`` would choose it, and
its verdict names the files a load reads (``Estimate.files``); the core knows no backend by name.
A verdict that names none gets every file of the repo except pickle weights (which no backend
loads). The small metadata files (config, tokenizer, generation config, chat templates) come too.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from anyformer._plugins import PluginManager
from anyformer._selection import raise_if_none
from anyformer.contract._caps import Caps
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._model import Model
from anyformer.contract._progress import ProgressCallback, no_progress
from anyformer.contract._verdict import Verdict

#: Top-level files pulled whenever the repo has them: what tokenizers and chat templates read.
METADATA_PATTERNS = ("config.json", "generation_config.json", "tokenizer*.json", "*.jinja")


@dataclasses.dataclass(frozen=True)
class PullResult:
    """What ``pull`` did: the model, the backend it pulled for, each file's path, and bytes fetched."""

    model: Model
    backend: str
    paths: Mapping[str, Path]
    downloaded: tuple[str, ...]

    @property
    def bytes(self) -> int:
        """Bytes of every pulled file (listing sizes)."""
        return sum(self.size_of(name) for name in self.paths)

    @property
    def downloaded_bytes(self) -> int:
        """Bytes fetched by this pull (files that were not in the cache before)."""
        return sum(self.size_of(name) for name in self.downloaded)

    def size_of(self, name: str) -> int:
        """Bytes of one pulled file (its listing size; 0 when unknown)."""
        entry = self.model.file(name)
        return (entry.size or 0) if entry is not None else 0

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return {
            "model": self.model.ref,
            "repo": self.model.repo,
            "revision": self.model.revision,
            "backend": self.backend,
            "bytes": self.bytes,
            "downloaded_bytes": self.downloaded_bytes,
            "files": [
                {"name": name, "path": str(path), "size": self.size_of(name), "downloaded": name in self.downloaded}
                for name, path in self.paths.items()
            ],
        }


def files_to_pull(model: Model, verdict: Verdict) -> list[str]:
    """The files a pull for ``verdict``'s backend fetches: metadata files first, then the backend's files."""
    named = tuple(verdict.estimate.files) if verdict.estimate is not None else ()
    if any(not isinstance(name, str) for name in named):
        raise AnyformerError(ErrorCode.PLUGIN_ERROR, f"{verdict.backend}: Estimate.files must be file names")
    if named:
        weights = list(named)
    else:
        weights = [f.name for f in model.files if f.format != "pickle"]
    metadata = [f.name for f in model.files if _is_metadata(f.name)]
    return list(dict.fromkeys(metadata + weights))


def _is_metadata(name: str) -> bool:
    return "/" not in name and any(fnmatch.fnmatchcase(name, pattern) for pattern in METADATA_PATTERNS)


def pull(
    model: str | os.PathLike[str] | Model,
    *,
    backend: str | None = None,
    task: str | None = None,
    budget: int | str | None = None,
    caps: Caps | None = None,
    prefer: Sequence[str] | str | None = None,
    progress: ProgressCallback = no_progress,
    plugins: PluginManager | None = None,
) -> PullResult:
    """Download what the chosen (or named) backend needs to run a Hub model into huggingface_hub's cache.

    Raises ``NO_BACKEND`` / ``BUDGET_TOO_SMALL`` when nothing could run it (nothing is fetched),
    ``BAD_REQUEST`` for a local model, and the store's ``DOWNLOAD_FAILED``, ``DISK_FULL``, ``OFFLINE``.
    """
    from anyformer._api import check
    from anyformer.store._store import fetch_files

    description, selection = check(
        model, task=task, budget=budget, caps=caps, prefer=prefer, backend=backend, plugins=plugins
    )
    if description.source != "hub":
        raise AnyformerError(
            ErrorCode.BAD_REQUEST, f"{description.ref} is not a Hub model; pull fetches Hub repos (org/name)"
        )
    chosen = raise_if_none(selection, description.ref, description.formats)
    names = files_to_pull(description, chosen)
    before = _cached(description, names)
    paths = fetch_files(description, names, progress, backend=chosen.backend)
    downloaded = tuple(name for name in names if name not in before)
    return PullResult(model=description, backend=chosen.backend, paths=paths, downloaded=downloaded)


def _cached(model: Model, names: Sequence[str]) -> set[str]:
    from anyformer.store._cache_layout import RepoCache

    cache = RepoCache.of(model.repo)
    commit = cache.commit_for(model.revision)
    if commit is None:
        return set()
    return {name for name in names if cache.cached_file(commit, name) is not None}
