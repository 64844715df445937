"""Where llama.cpp's rpc-server binary is: the one built from the llama.cpp that llama-cpp-python vendors."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
from pathlib import Path

#: An explicit path to the binary, taking precedence over the cache and PATH.
BINARY_ENV = "ANYFORMER_RPC_SERVER_BIN"
#: The build's flavour in the cache directory's name (scripts/llama_build.py makes the directory).
FLAVOUR = "portable-rpc"
#: The binary's name in llama.cpp's build (older releases called it ``rpc-server``).
NAMES = ("ggml-rpc-server", "rpc-server")


def cache_root() -> Path:
    """Where built wheels and binaries are kept: ``$ANYFORMER_WHEELHOUSE`` or ~/.cache/anyformer-wheelhouse."""
    return Path(os.environ.get("ANYFORMER_WHEELHOUSE") or Path.home() / ".cache" / "anyformer-wheelhouse")


def tools_dir(version: str | None = None) -> Path | None:
    """The directory scripts/build-llama-tools fills for the installed llama-cpp-python (or ``version``)."""
    if version is None:
        try:
            version = importlib.metadata.version("llama-cpp-python")
        except importlib.metadata.PackageNotFoundError:
            return None
    return cache_root() / f"llama-cpp-tools-{version}-{FLAVOUR}"


def find_tool(names: tuple[str, ...]) -> Path | None:
    """The first of ``names`` in the tools directory, else on PATH, or None."""
    folder = tools_dir()
    for name in names:
        if folder is not None and os.access(folder / name, os.X_OK):
            return folder / name
    for name in names:
        found = shutil.which(name)
        if found:
            return Path(found)
    return None


def find_rpc_server() -> Path | None:
    """The rpc-server binary: ``$ANYFORMER_RPC_SERVER_BIN``, the tools directory, or PATH; None when none is found."""
    explicit = os.environ.get(BINARY_ENV)
    if explicit:
        return Path(explicit) if os.access(explicit, os.X_OK) else None
    return find_tool(NAMES)


def build_hint() -> str:
    """How to get the binary, for an error message."""
    where = tools_dir()
    return (
        "build it with `bash scripts/build-llama-tools` from an anyformer checkout"
        + (f" (it lands in {where})" if where else "")
        + f", or set {BINARY_ENV} to an rpc-server built from llama-cpp-python's llama.cpp"
    )
