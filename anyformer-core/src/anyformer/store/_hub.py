"""``describe_hub``: a model description from the Hugging Face Hub, through huggingface_hub (docs/contract.md).

Only metadata crosses the network: the model info with file sizes, config.json, and when nothing
else names the architecture, the header of one GGUF read by HTTP range requests. Offline, the
description comes from the files already in huggingface_hub's cache.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import huggingface_hub
from huggingface_hub import constants

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._model import Model, ModelFile, check_file_name, first_language_model_gguf
from anyformer.files._config_file import MAX_CONFIG_BYTES, read_config_json
from anyformer.store._download import HubFile, download
from anyformer.store._hub_bytes import HubByteSource
from anyformer.store._hub_errors import hub_errors, is_offline, offline_error
from anyformer.store._hub_errors import hub_ref as _ref

__all__ = [
    "HubByteSource",
    "cached_snapshot",
    "check_repo_id",
    "describe_cached",
    "describe_hub",
    "first_language_model_gguf",
    "hub_errors",
    "is_offline",
]

# A Hub name part: letters, digits, ``-``, ``_``, ``.``; not starting or ending with ``-`` or ``.``.
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_REPO_ID = re.compile(rf"^(?:{_PART}/)?{_PART}\Z")
_REVISION = re.compile(r"^[A-Za-z0-9._/-]{1,256}\Z")
_COMMIT = re.compile(r"^[0-9a-f]{40}\Z")
_SHA256 = re.compile(r"^[0-9a-f]{64}\Z")


def looks_like_repo_id(text: str) -> bool:
    """True when ``text`` has the form of a Hub model id (``org/name`` or ``name``)."""
    return isinstance(text, str) and bool(_REPO_ID.match(text)) and "--" not in text and ".." not in text


def check_repo_id(repo_id: str) -> str:
    """Return ``repo_id`` if it is a Hub model id (``org/name`` or ``name``), else raise ``BAD_REQUEST``."""
    if not looks_like_repo_id(repo_id):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{repo_id!r:.200} is not a Hub repo id (org/name or name)")
    return repo_id


def _check_revision(revision: str | None) -> None:
    if revision is None:
        return
    if not isinstance(revision, str) or not _REVISION.match(revision) or ".." in revision or revision.startswith("/"):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{revision!r:.200} is not a revision (a branch, tag or commit)")


def describe_hub(repo_id: str, revision: str | None = None) -> Model:
    """Describe a Hub model repo without downloading its weights.

    Files, sizes and LFS sha256 come from the model info; ``architecture`` from config.json's
    ``model_type``, else the Hub's GGUF facts, else the first language-model GGUF's header (read by
    range requests). Offline (``HF_HUB_OFFLINE=1`` or no connection) a repo already in the
    huggingface_hub cache is described from the cached snapshot; one that is not is ``OFFLINE``.
    """
    check_repo_id(repo_id)
    _check_revision(revision)
    if is_offline():
        return describe_cached(repo_id, revision, None)
    try:
        with hub_errors(repo_id, revision):
            info = huggingface_hub.HfApi().model_info(repo_id, revision=revision, files_metadata=True)
    except AnyformerError as exc:
        if exc.code is ErrorCode.OFFLINE:
            return describe_cached(repo_id, revision, exc)
        raise
    with hub_errors(repo_id, revision):
        return _describe_info(repo_id, revision, info)


def _describe_info(repo_id: str, revision: str | None, info: Any) -> Model:
    sha = info.sha if isinstance(info.sha, str) and _COMMIT.match(info.sha) else None
    resolved = sha or revision
    files = tuple(_sibling_file(s) for s in (info.siblings or ()))
    config: dict[str, Any] = {}
    # The branch or tag asked for: the store points it at the commit once the files are stored.
    metadata: dict[str, Any] = {"hub_ref": revision or constants.DEFAULT_REVISION}
    config_entry = next((f for f in files if f.name == "config.json"), None)
    if config_entry is not None:
        config = _hub_config(repo_id, resolved, config_entry)
    architecture = _model_type(config)
    hub_gguf = info.gguf if isinstance(info.gguf, dict) else None
    if hub_gguf:
        metadata["hub_gguf"] = {k: hub_gguf[k] for k in ("architecture", "total", "context_length") if k in hub_gguf}
        if architecture is None and isinstance(hub_gguf.get("architecture"), str):
            architecture = hub_gguf["architecture"]
    tags = tuple(t for t in info.tags if isinstance(t, str)) if isinstance(info.tags, list) else ()
    model = Model(
        repo=repo_id,
        revision=resolved,
        architecture=architecture,
        task=info.pipeline_tag if isinstance(info.pipeline_tag, str) else None,
        tags=tags,
        files=files,
        source="hub",
        metadata=metadata,
        config=config,
    )
    return _with_one_header(model)


def _with_one_header(model: Model) -> Model:
    """``model`` with one language-model candidate's header summary (``metadata["gguf"]``, ``["gguf_files"]``).

    The header's layer and head counts size the KV cache in backends' estimates and name the
    architecture when nothing else does. Which candidate a backend loads is the backend's choice
    (it asks :func:`~anyformer.store._gguf_facts.gguf_facts` for that one); describe reads one, a
    usual quant first, from the per-commit cache or by a few range requests, never the weights.
    """
    from anyformer.files._gguf_candidates import describing_candidate
    from anyformer.store._gguf_facts import gguf_facts

    candidate = describing_candidate(model)
    if candidate is None:
        return model
    summary = gguf_facts(model, candidate)
    if summary is None:
        return model
    metadata = {**model.metadata, "gguf": summary, "gguf_file": candidate.name, "gguf_files": {candidate.name: summary}}
    architecture = model.architecture or summary.get("architecture")
    return dataclasses.replace(model, metadata=metadata, architecture=architecture)


def _sibling_file(sibling: Any) -> ModelFile:
    name = check_file_name(sibling.rfilename)
    size = sibling.size if isinstance(sibling.size, int) and not isinstance(sibling.size, bool) else None
    if size is not None and size < 0:
        size = None
    lfs = sibling.lfs
    sha = lfs.sha256.lower() if lfs is not None and isinstance(lfs.sha256, str) else None
    return ModelFile(name=name, size=size, sha256=sha if sha and _SHA256.match(sha) else None)


def _hub_config(repo_id: str, revision: str | None, entry: ModelFile) -> dict[str, Any]:
    if entry.size is not None and entry.size > MAX_CONFIG_BYTES:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"config.json of {repo_id} is {entry.size} bytes; not a config file")
    path = download(HubFile(repo_id, revision or constants.DEFAULT_REVISION, "config.json", entry.size, entry.sha256))
    return read_config_json(path, f"config.json of {_ref(repo_id, revision)}")


def _model_type(config: dict[str, Any]) -> str | None:
    value = config.get("model_type")
    return value if isinstance(value, str) and value else None


def cached_snapshot(repo_id: str, revision: str | None) -> tuple[str, Path] | None:
    """``(commit, folder)`` of the repo's snapshot in huggingface_hub's cache, or None when not cached."""
    folder = Path(constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", constants.REPO_ID_SEPARATOR))
    wanted = revision or constants.DEFAULT_REVISION
    if _COMMIT.match(wanted):
        commit = wanted
    else:
        try:
            commit = (folder / "refs" / wanted).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
        if not _COMMIT.match(commit):
            return None
    snapshot = folder / "snapshots" / commit
    return (commit, snapshot) if snapshot.is_dir() else None


def describe_cached(repo_id: str, revision: str | None, cause: AnyformerError | None = None) -> Model:
    """Describe a repo from its snapshot in huggingface_hub's cache, opening no connection.

    Only the files present are listed (a dangling link is skipped). Not cached: ``cause`` is raised
    when given, else ``OFFLINE`` naming the ``anyformer pull`` that would fetch it.
    """
    found = cached_snapshot(repo_id, revision)
    if found is None:
        if cause is not None:
            raise cause
        raise offline_error(repo_id, revision)
    commit, snapshot = found
    files = []
    for root, dirs, names in os.walk(snapshot):
        dirs.sort()
        for file_name in sorted(names):
            full = Path(root) / file_name
            try:
                size = full.stat().st_size  # follows the snapshot symlink to its blob
            except OSError:
                continue  # a dangling link: the blob was deleted from the cache
            target = os.path.basename(os.path.realpath(full))
            name = check_file_name(full.relative_to(snapshot).as_posix())
            files.append(ModelFile(name=name, size=size, sha256=target if _SHA256.match(target) else None))
    config: dict[str, Any] = {}
    if (snapshot / "config.json").is_file():
        config = read_config_json(snapshot / "config.json", f"cached config.json of {repo_id}")
    architecture = _model_type(config)
    metadata: dict[str, Any] = {"hub_ref": revision or constants.DEFAULT_REVISION}
    model = Model(
        repo=repo_id,
        revision=commit,
        architecture=architecture,
        files=tuple(files),
        source="hub",
        metadata=metadata,
        config=config,
    )
    from anyformer.files._gguf_candidates import describing_candidate

    candidate = describing_candidate(model)
    if candidate is None:
        return model
    from anyformer.files._gguf_header import read_gguf_header

    summary = read_gguf_header(snapshot / candidate.name, name=candidate.name).summary()
    metadata.update({"gguf": summary, "gguf_file": candidate.name, "gguf_files": {candidate.name: summary}})
    return dataclasses.replace(model, metadata=metadata, architecture=architecture or summary.get("architecture"))
