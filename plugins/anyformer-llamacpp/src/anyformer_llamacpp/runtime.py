"""Facts about the installed llama-cpp-python, found without importing it (``can_run`` stays fast)."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

#: ggml libraries that mean llama.cpp can offload layers to a GPU.
_GPU_LIBRARIES = ("libggml-cuda", "libggml-vulkan", "libggml-metal", "libggml-hip", "libggml-sycl", "libggml-musa")

INSTALL_HINT = (
    "pip install llama-cpp-python (it compiles llama.cpp; for CUDA: "
    'CMAKE_ARGS="-DGGML_CUDA=on" pip install llama-cpp-python)'
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
