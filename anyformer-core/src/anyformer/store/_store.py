"""The model store (docs/contract.md, "The store"): files come through huggingface_hub's cache, or from local paths.

Backends call :func:`fetch_files` in ``load`` to get local paths for the files they chose; ``anyformer
pull`` calls it for the files a backend named. Hub files already in the cache are used as they are
(no connection); missing ones are downloaded, verified, into the cache (``_download``), after a
check that the disk has room for all of them. With ``HF_HUB_OFFLINE=1`` nothing is downloaded: a
missing file is ``OFFLINE`` naming the ``anyformer pull`` that would fetch it.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._model import Model, ModelFile, check_file_name
from anyformer.contract._progress import ProgressCallback, ProgressEvent, no_progress


def fetch_files(
    model: Model, names: Sequence[str], progress: ProgressCallback = no_progress, *, backend: str | None = None
) -> dict[str, Path]:
    """Local paths for ``names`` of ``model``: local files as they are, Hub files from the cache or downloaded.

    Downloads report a ``download`` :class:`ProgressEvent` per file (bytes done of total) and one
    with ``file=None`` for all of them together. Raises ``MODEL_NOT_FOUND`` for a name the model
    does not have, ``OFFLINE``, ``DOWNLOAD_FAILED`` or ``DISK_FULL`` (SAFETY D1–D8).
    """
    paths: dict[str, Path] = {}
    from_hub: list[ModelFile] = []
    for name in dict.fromkeys(names):
        check_file_name(name)
        entry = model.file(name)
        if entry is None:
            raise AnyformerError(ErrorCode.MODEL_NOT_FOUND, f"{model.ref} has no file {name}")
        if entry.path:
            path = Path(entry.path)
            if not path.is_file():
                raise AnyformerError(ErrorCode.MODEL_NOT_FOUND, f"{path} is missing")
            paths[name] = path
        elif model.source == "hub":
            from_hub.append(entry)
        else:
            raise AnyformerError(
                ErrorCode.MODEL_NOT_FOUND,
                f"{name} of {model.repo} is only described, not on disk: "
                "describe a Hub repo or a local path to load it",
            )
    if from_hub:
        paths.update(_fetch_from_hub(model, from_hub, progress, backend))
    return {name: paths[name] for name in dict.fromkeys(names)}


def files_to_download(model: Model, names: Sequence[str]) -> list[ModelFile]:
    """The files among ``names`` that a load would download: Hub files not yet in the cache.

    Local files, described-only files and Hub files already cached (at the described revision,
    with the listed size) need nothing. Reads the cache folder only, opens no connection, so
    ``can_run`` may call it to refuse with ``store`` when the store cannot take the download.
    """
    if model.source != "hub":
        return []
    from anyformer.store._cache_layout import RepoCache

    cache = RepoCache.of(model.repo)
    commit = cache.commit_for(model.revision)
    missing: list[ModelFile] = []
    for name in dict.fromkeys(names):
        entry = model.file(name)
        if entry is None or entry.path:
            continue
        cached = cache.cached_file(commit, entry.name) if commit else None
        if cached is None or (entry.size is not None and cached.stat().st_size != entry.size):
            missing.append(entry)
    return missing


def _fetch_from_hub(
    model: Model, entries: Sequence[ModelFile], progress: ProgressCallback, backend: str | None
) -> dict[str, Path]:
    from anyformer.store._cache_layout import RepoCache
    from anyformer.store._download import HubFile, download
    from anyformer.store._hub_errors import is_offline

    cache = RepoCache.of(model.repo)
    commit = cache.commit_for(model.revision)
    ref = model.metadata.get("hub_ref")
    paths: dict[str, Path] = {}
    missing: list[ModelFile] = []
    for entry in entries:
        cached = cache.cached_file(commit, entry.name) if commit else None
        if cached is not None and (entry.size is None or cached.stat().st_size == entry.size):
            paths[entry.name] = cached
        else:
            missing.append(entry)
    if missing and is_offline():
        names = ", ".join(e.name for e in missing)
        raise AnyformerError(
            ErrorCode.OFFLINE,
            f"{names} of {model.ref} is not in the local cache and HF_HUB_OFFLINE is set; "
            f"run `anyformer pull {_pull_ref(model)}` while online",
        )
    if missing:
        _check_room(cache.root, missing)
        total = _Totals(missing, progress, backend)
        for entry in missing:
            revision = model.revision or (ref if isinstance(ref, str) else None) or "main"
            paths[entry.name] = download(
                HubFile(model.repo, revision, entry.name, entry.size, entry.sha256), total.reporter(entry)
            )
            total.finished(entry)
        commit = commit or _commit_of(paths[missing[0].name])
    if isinstance(ref, str) and commit:
        with contextlib.suppress(OSError, AnyformerError):  # a read-only cache still serves what it holds
            cache.write_ref(ref, commit)
    return paths


def _pull_ref(model: Model) -> str:
    ref = model.metadata.get("hub_ref")
    return f"{model.repo}@{ref}" if isinstance(ref, str) and ref != "main" else model.repo


def _commit_of(pointer: Path) -> str:
    return next(p.name for p in pointer.parents if p.parent.name == "snapshots")


def _check_room(repo_root: Path, files: Sequence[ModelFile]) -> None:
    """``DISK_FULL`` before the first byte when the listed sizes do not fit (SAFETY D6)."""
    need = sum(f.size or 0 for f in files)
    folder = repo_root
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    partial = 0
    blobs = repo_root / "blobs"
    if blobs.is_dir():
        partial = sum(p.stat().st_size for p in blobs.glob("*.incomplete") if p.is_file())
    free = shutil.disk_usage(folder).free
    if need - partial > free:
        from anyformer.contract._sizes import format_size

        raise AnyformerError(
            ErrorCode.DISK_FULL,
            f"{len(files)} file(s) need {format_size(need - partial)} and {folder} has {format_size(free)} free; "
            "nothing was downloaded",
        )


class _Totals:
    """Progress for each file and for all of them together."""

    def __init__(self, files: Sequence[ModelFile], progress: ProgressCallback, backend: str | None) -> None:
        self._progress = progress
        self._backend = backend
        sizes = [f.size for f in files]
        self._total = sum(s for s in sizes if s is not None) if all(s is not None for s in sizes) else None
        self._finished = 0
        progress(ProgressEvent(stage="download", backend=backend, done=0, total=self._total, message="total"))

    def reporter(self, entry: ModelFile) -> Callable[[int, int | None], None]:
        """A callback for one file's (done, total) bytes."""
        self._progress(ProgressEvent(stage="download", backend=self._backend, file=entry.name, total=entry.size))

        def report(done: int, total: int | None) -> None:
            self._progress(
                ProgressEvent(stage="download", backend=self._backend, file=entry.name, done=done, total=total)
            )
            self._progress(
                ProgressEvent(
                    stage="download",
                    backend=self._backend,
                    done=self._finished + done,
                    total=self._total,
                    message="total",
                )
            )

        return report

    def finished(self, entry: ModelFile) -> None:
        """Count a file as done (also one that was already whole in the cache)."""
        self._finished += entry.size or 0
        self._progress(
            ProgressEvent(
                stage="download", backend=self._backend, file=entry.name, done=entry.size or 0, total=entry.size
            )
        )
        self._progress(
            ProgressEvent(
                stage="download", backend=self._backend, done=self._finished, total=self._total, message="total"
            )
        )
