"""Where llama.cpp's rpc-server binary is: the one built from the llama.cpp that llama-cpp-python vendors."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

#: An explicit path to the binary, taking precedence over the cache and PATH.
BINARY_ENV = "ANYFORMER_RPC_SERVER_BIN"
#: The CPU build's flavour in the cache directory's name (scripts/llama_build.py names the same; a GPU
#: build's is ``cuda-sm90-rpc``, ``hip-gfx1100-rpc``, ``vulkan-rpc``, ``metal-rpc``).
FLAVOUR = "portable-rpc"
#: The ggml libraries that name a llama-cpp-python build's GPU backend.
_GPU_LIBRARIES = ("cuda", "hip", "vulkan", "metal")
#: The binary's name in llama.cpp's build (older releases called it ``rpc-server``).
NAMES = ("ggml-rpc-server", "rpc-server")


def cache_root() -> Path:
    """Where built wheels and binaries are kept: ``$ANYFORMER_WHEELHOUSE`` or ~/.cache/anyformer-wheelhouse."""
    return Path(os.environ.get("ANYFORMER_WHEELHOUSE") or Path.home() / ".cache" / "anyformer-wheelhouse")


def installed_version() -> str | None:
    """The installed llama-cpp-python's version, or None."""
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_gpu_backend() -> str | None:
    """The GPU backend the installed llama-cpp-python was built with (its ``libggml-cuda``…), or None."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    names = [p.name for p in [*folder.glob("lib/libggml-*"), *folder.glob("libggml-*"), *folder.glob("lib/ggml-*")]]
    for backend in _GPU_LIBRARIES:
        if any(name.startswith((f"libggml-{backend}", f"ggml-{backend}")) for name in names):
            return backend
    return None


def nvidia_architecture() -> str | None:
    """The first NVIDIA GPU's compute capability as CMake names it (``90``), from nvidia-smi, or None."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run(
            [smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    digits = (done.stdout.strip().splitlines() or [""])[0].replace(".", "").strip()
    return digits if done.returncode == 0 and digits.isdigit() else None


def tools_flavour(backend: str | None, architecture: str | None = None) -> str:
    """The flavour in the tools directory's name, as scripts/llama_build.py names it."""
    if backend is None:
        return FLAVOUR
    if backend == "cuda" and architecture:
        return f"cuda-sm{architecture}-rpc"
    return f"{backend}-rpc"


def tools_dir(version: str | None = None) -> Path | None:
    """The directory scripts/build-llama-tools (or ``anyformer rpc-server --build``) fills for the
    installed llama-cpp-python (or ``version``), of the installed build's flavour.

    For a GPU build whose architecture is in the name (``cuda-sm90-rpc``), the one built is found.
    """
    version = version or installed_version()
    if version is None:
        return None
    backend = installed_gpu_backend()
    if backend is not None:
        for built in sorted(cache_root().glob(f"llama-cpp-tools-{version}-{backend}-*rpc")):
            return built
    return cache_root() / f"llama-cpp-tools-{version}-{tools_flavour(backend)}"


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
        "build it with `anyformer rpc-server --build` (from llama-cpp-python's sdist, which pip downloads, or "
        "--sdist FILE; needs CMake and a C++ compiler) or `bash scripts/build-llama-tools` from a checkout"
        + (f" (it lands in {where})" if where else "")
        + f", or set {BINARY_ENV} to an rpc-server built from llama-cpp-python's llama.cpp"
    )
