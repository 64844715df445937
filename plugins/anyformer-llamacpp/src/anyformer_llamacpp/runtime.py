"""Facts about the installed llama-cpp-python, found without importing it (``can_run`` stays fast)."""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

from anyformer.plugin import Caps

#: ggml libraries that mean llama.cpp can offload layers to a GPU.
_GPU_LIBRARIES = ("libggml-cuda", "libggml-vulkan", "libggml-metal", "libggml-hip", "libggml-sycl", "libggml-musa")

INSTALL_HINT = (
    "pip install llama-cpp-python (it compiles llama.cpp; for CUDA: "
    'CMAKE_ARGS="-DGGML_CUDA=on" pip install llama-cpp-python)'
)


#: The CMake switch of each GPU backend llama.cpp builds (an install from a checkout takes the same
#: from scripts/llama_build.py), always with the portable CPU code and RPC beside it.
GPU_BUILD_FLAGS = {
    "cuda": "-DGGML_CUDA=ON",
    "hip": "-DGGML_HIP=ON",
    "vulkan": "-DGGML_VULKAN=ON",
    "metal": "-DGGML_METAL=ON",
}
_COMMON_FLAGS = "-DGGML_NATIVE=OFF -DGGML_RPC=ON"
#: The llama.cpp backend for the GPU whose memory a probe source reported (caps.gpu_memory_source).
_BACKEND_FOR_SOURCE = {
    "nvml": "cuda",
    "nvidia-smi": "cuda",
    "amd-smi": "hip",
    "rocm-smi": "hip",
    "metal": "metal",
    "vulkan": "vulkan",
}


#: The llama-cpp-python releases whose internals the engine reaches into (``Llama._model``,
#: ``Llama._ctx``, ``Llama.input_ids``, ``llama_get_logits_ith``): from the release it was tested
#: against up to, not including, the next minor series. The distribution's dependency says the same.
SUPPORTED_FROM = (0, 3, 36)
SUPPORTED_BELOW = (0, 4, 0)
SUPPORTED_SPEC = "llama-cpp-python>=0.3.36,<0.4"


def llama_cpp_version() -> str | None:
    """The installed llama-cpp-python's version, from its metadata (nothing is imported), or None.

    The ``*.dist-info`` folder beside the ``llama_cpp`` package names it (what pip and uv write);
    ``importlib.metadata`` (~20 ms to import, on every command's path) is asked only when there is
    not exactly one.
    """
    folder = llama_cpp_folder()
    if folder is not None:
        prefix = "llama_cpp_python-"
        beside = list(folder.parent.glob(f"{prefix}*.dist-info"))
        if len(beside) == 1:
            return beside[0].name[len(prefix) : -len(".dist-info")]
    import importlib.metadata

    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...] | None:
    match = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", version)
    return tuple(int(part or 0) for part in match.groups()) if match else None


def unsupported_version_reason(version: str | None) -> str | None:
    """Why ``version`` of llama-cpp-python cannot be used (a ``runtime`` refusal's reason), or None when it can."""
    if version is None:
        return None  # installed without metadata (a source tree on sys.path): nothing to hold it against
    release = _release(version)
    if release is not None and SUPPORTED_FROM <= release < SUPPORTED_BELOW:
        return None
    return (
        f"llama-cpp-python {version} is installed; this backend uses its internals (Llama._model, _ctx, "
        f"input_ids) as 0.3.36 up to 0.4 has them: pip install '{SUPPORTED_SPEC}'"
    )


@functools.lru_cache(maxsize=1)
def llama_cpp_folder() -> Path | None:
    """The installed ``llama_cpp`` package folder, or None when it is not installed."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@functools.lru_cache(maxsize=1)
def gpu_offload_library() -> str | None:
    """The name of the GPU backend llama.cpp was built with (``cuda``, ``vulkan``…), or None on a CPU build."""
    folder = llama_cpp_folder()
    if folder is None:
        return None
    for library in sorted((folder / "lib").glob("libggml-*")) + sorted(folder.glob("libggml-*")):
        for prefix in _GPU_LIBRARIES:
            if library.name.startswith(prefix):
                return prefix.removeprefix("libggml-")
    return None


def gpu_backend_for(caps: Caps) -> str | None:
    """The llama.cpp backend a build for this machine's GPU would use, or None where there is no GPU.

    The GPU memory's source names the vendor (NVML: CUDA; ROCm's tools: HIP; Metal; Vulkan); a GPU the
    adapter probe found without one is asked through Vulkan. A software adapter is no GPU.
    """
    if caps.gpu_memory_source in _BACKEND_FOR_SOURCE:
        return _BACKEND_FOR_SOURCE[caps.gpu_memory_source]
    if caps.gpu and caps.gpu_type != "CPU" and caps.gpu_memory_source != "host":
        return "vulkan"
    return None


def rebuild_command(backend: str, version: str | None) -> str:
    """The pip command that rebuilds the installed llama-cpp-python for ``backend``, RPC kept."""
    pinned = f"llama-cpp-python=={version}" if version else "llama-cpp-python"
    return (
        f'CMAKE_ARGS="{_COMMON_FLAGS} {GPU_BUILD_FLAGS[backend]}" pip install --force-reinstall --no-deps '
        f"--no-cache-dir '{pinned}' (from a checkout: bash scripts/install)"
    )


def unused_gpu_note(caps: Caps, gpu_library: str | None) -> str | None:
    """What to say when this machine has a GPU and the installed llama.cpp cannot offload to it, else None."""
    backend = gpu_backend_for(caps)
    if backend is None or gpu_library is not None:
        return None
    where = caps.gpu_name or "a GPU"
    return (
        f"{where} is here but llama-cpp-python was built for the CPU only: every layer runs on the CPU; "
        f"rebuild it for {backend}: {rebuild_command(backend, llama_cpp_version())}"
    )
