"""``describe(ref)``: a model description from a Hub id, a local folder or file, or JSON (docs/contract.md)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._model import Model, ModelFile, format_of
from anyformer.files._config_file import read_config_json
from anyformer.files._gguf_candidates import describing_candidate, gguf_candidates
from anyformer.files._model_card import read_card_facts

# Folders in a model directory that hold no model files (VCS, caches, editor state).
_SKIP_DIRS = {".git", ".cache", ".huggingface", "__pycache__", ".ipynb_checkpoints"}
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?(@[A-Za-z0-9._/-]+)?\Z")
# The most files a local folder may list: a model folder with more is a mistake (a home directory).
_MAX_LOCAL_FILES = 10_000


def describe(ref: str | os.PathLike[str] | Mapping[str, Any] | Model) -> Model:
    """Describe a model without downloading its weights.

    ``ref`` is a Hub repo id (``org/name[@revision]``), a local folder, a local ``.gguf`` or
    ``.onnx`` file, a ``.json`` description file, a dict shaped as docs/contract.md describes, or a ``Model``.
    Model headers are read with anyformer's bounded readers, so a hostile file is ``BAD_MODEL``
    here already.
    """
    if isinstance(ref, Model):
        return ref
    if isinstance(ref, Mapping):
        return Model.from_dict(ref)
    if not isinstance(ref, (str, os.PathLike)):
        raise AnyformerError(
            ErrorCode.BAD_REQUEST, f"a model reference is a string, path or dict, not {type(ref).__name__}"
        )
    text = os.fspath(ref)
    if not text.strip():
        raise AnyformerError(ErrorCode.BAD_REQUEST, "empty model reference")
    path = Path(text).expanduser()
    if _exists(path):
        if path.is_dir():
            return describe_folder(path)
        if path.suffix.lower() == ".json":
            return Model.from_json_file(path)
        return describe_file(path)
    if _looks_like_path(text):
        raise AnyformerError(ErrorCode.MODEL_NOT_FOUND, f"no such file or folder: {text}")
    if not _REPO_ID.match(text):
        raise AnyformerError(
            ErrorCode.BAD_REQUEST,
            f"{text!r:.200} is neither an existing path nor a Hub repo id (org/name[@revision])",
        )
    repo, _, revision = text.partition("@")
    from anyformer.store._hub import describe_hub  # huggingface_hub is imported only when the Hub is asked

    return describe_hub(repo, revision or None)


def _exists(path: Path) -> bool:
    """Whether ``path`` exists; a name the system cannot even look up (too long, a NUL) does not."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _looks_like_path(text: str) -> bool:
    """A reference that names a file rather than a repo: it is missing, not a Hub id."""
    return text.startswith((".", "/", "~")) or text.lower().endswith(
        (".gguf", ".onnx", ".json", ".safetensors", ".bin")
    )


def describe_file(path: Path) -> Model:
    """Describe one local model file: a GGUF, an ONNX graph (with its external data), or weights."""
    # Absolute, but links kept: a Hub-cache snapshot file links to a blob whose name says nothing.
    path = Path(os.path.abspath(path))
    fmt = format_of(path.name)
    if fmt is None:
        raise AnyformerError(
            ErrorCode.BAD_REQUEST, f"{path.name} is not a model file anyformer reads (.gguf, .onnx, .safetensors)"
        )
    files = [_local_file(path, path.name)]
    metadata: dict[str, Any] = {}
    architecture = None
    if fmt == "gguf":
        header = _gguf_summary(path)
        metadata = {"gguf": header, "gguf_file": path.name, "gguf_files": {path.name: header}}
        architecture = header.get("architecture")
    elif fmt == "onnx":
        from anyformer.files._onnx_external import check_onnx_external_data, read_onnx_summary

        summary = read_onnx_summary(path)
        metadata = {"onnx": {"producer": summary.producer, "ir_version": summary.ir_version, "opsets": summary.opsets}}
        for data_path in check_onnx_external_data(path):
            files.append(_local_file(data_path, data_path.name))
    elif fmt == "safetensors":
        from anyformer.files._safetensors_header import read_safetensors_header

        read_safetensors_header(path)
    return Model(
        repo=str(path),
        architecture=architecture,
        files=tuple(files),
        source="local",
        metadata=metadata,
        tags=(fmt,) if fmt != "pickle" else (),
    )


def describe_folder(folder: Path) -> Model:
    """Describe a local model folder: every file, config.json's ``model_type``, the first LM GGUF's header.

    Tags and the task (when config.json has no ``pipeline_tag``) come from README.md's front matter,
    as they do on the Hub.
    """
    folder = folder.resolve()
    files: list[ModelFile] = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for name in sorted(names):
            full = Path(root) / name
            files.append(_local_file(full, full.relative_to(folder).as_posix()))
            if len(files) > _MAX_LOCAL_FILES:
                raise AnyformerError(
                    ErrorCode.BAD_REQUEST,
                    f"{folder} holds over {_MAX_LOCAL_FILES} files; point at the model's own folder",
                )
    config = _read_config(folder / "config.json")
    metadata: dict[str, Any] = {}
    architecture = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    # Every GGUF header is checked (a hostile projector is BAD_MODEL here too); the language model's describes.
    summaries = {f.name: _gguf_summary(Path(f.path or "")) for f in files if f.format == "gguf"}
    language_model = describing_candidate(Model(repo=str(folder), files=tuple(files)))
    if language_model is not None:
        from anyformer.store._gguf_facts import with_set_bytes

        summary = with_set_bytes(summaries[language_model.name], language_model)
        metadata = {"gguf": summary, "gguf_file": language_model.name, "gguf_files": _set_summaries(files, summaries)}
        architecture = architecture or summary.get("architecture")
    for model_file in files:
        if model_file.format == "safetensors":
            from anyformer.files._safetensors_header import read_safetensors_header

            read_safetensors_header(Path(model_file.path or ""))
        elif model_file.format == "onnx":
            from anyformer.files._onnx_external import check_onnx_external_data

            check_onnx_external_data(Path(model_file.path or ""))
    card = read_card_facts(folder / "README.md")
    task = config.get("pipeline_tag") if isinstance(config.get("pipeline_tag"), str) else card.pipeline_tag
    return Model(
        repo=str(folder),
        architecture=architecture,
        task=task,
        tags=card.tags,
        files=tuple(files),
        source="local",
        metadata=metadata,
        config=config,
    )


def _set_summaries(files: list[ModelFile], summaries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each language-model candidate's summary by its first file's name (a split set's data bytes summed)."""
    from anyformer.store._gguf_facts import with_set_bytes

    model = Model(repo="folder", files=tuple(files))
    return {c.name: with_set_bytes(summaries[c.name], c) for c in gguf_candidates(model)}


def _local_file(path: Path, name: str) -> ModelFile:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"cannot read {path}: {exc.strerror}", cause=exc) from exc
    return ModelFile(name=name, size=size, path=str(path))


def _gguf_summary(path: Path) -> dict[str, Any]:
    from anyformer.files._gguf_header import read_gguf_header

    try:
        return read_gguf_header(path, name=path.name).summary()
    except PermissionError as exc:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"cannot read {path.name}: permission denied", cause=exc) from exc


def _read_config(path: Path) -> dict[str, Any]:
    return read_config_json(path, str(path)) if path.is_file() else {}
