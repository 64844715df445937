"""The model store (CONTRACT §8): files come through huggingface_hub's cache, or from local paths.

Backends call :func:`fetch_files` in ``load`` to get local paths for the files they chose; the
store downloads Hub files on demand with progress, and maps the client's errors to our codes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from anyformer._errors import AnyformerError, ErrorCode
from anyformer._model import Model, check_file_name
from anyformer._progress import ProgressCallback, ProgressEvent, no_progress


def fetch_files(
    model: Model, names: Sequence[str], progress: ProgressCallback = no_progress, *, backend: str | None = None
) -> dict[str, Path]:
    """Local paths for ``names`` of ``model``: local files as they are, Hub files from the cache or downloaded."""
    paths: dict[str, Path] = {}
    for name in names:
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
            paths[name] = _download(model, name, entry.size, progress, backend)
        else:
            raise AnyformerError(
                ErrorCode.MODEL_NOT_FOUND,
                f"{name} of {model.repo} is only described, not on disk: "
                "describe a Hub repo or a local path to load it",
            )
    return paths


def _download(model: Model, name: str, size: int | None, progress: ProgressCallback, backend: str | None) -> Path:
    import huggingface_hub

    from anyformer._hub import hub_errors

    progress(ProgressEvent(stage="download", backend=backend, file=name, done=0, total=size))
    with hub_errors(model.repo, model.revision):
        local = huggingface_hub.hf_hub_download(model.repo, name, revision=model.revision)
    progress(ProgressEvent(stage="download", backend=backend, file=name, done=size or 0, total=size))
    return Path(local)
