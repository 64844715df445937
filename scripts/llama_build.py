"""The one place that names the llama.cpp build every install path uses.

scripts/install, scripts/build-llama-tools and noxfile.py read the pinned llama-cpp-python version,
its CMake flags and the cache directories from here, so a change of version or flags changes the
cache names everywhere at once (a wheel built with other flags is never picked up by mistake).
Only the standard library: it runs before any virtual environment exists.

    python3 scripts/llama_build.py version|cmake-args|wheelhouse|tools-dir
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

LLAMA_CPP_VERSION = "0.3.36"
#: Portable (AVX2 and below: -march=native segfaults on CPUs with AMX) and with llama.cpp's RPC
#: backend, so one model can span several hosts (docs/rpc.md).
CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_RPC=ON"
#: The flavour in the cache names: a build with other flags gets another directory.
FLAVOUR = "portable-rpc"


def cache_root() -> Path:
    """Where built wheels and binaries are kept: ``$ANYFORMER_WHEELHOUSE`` or ~/.cache/anyformer-wheelhouse."""
    return Path(os.environ.get("ANYFORMER_WHEELHOUSE") or Path.home() / ".cache" / "anyformer-wheelhouse")


def wheelhouse() -> Path:
    """The directory holding the llama-cpp-python wheel built with CMAKE_ARGS."""
    return cache_root() / f"llama-cpp-python-{LLAMA_CPP_VERSION}-{FLAVOUR}"


def tools_dir() -> Path:
    """The directory holding llama.cpp's ggml-rpc-server and llama-server built from the same source."""
    return cache_root() / f"llama-cpp-tools-{LLAMA_CPP_VERSION}-{FLAVOUR}"


def main(argv: list[str]) -> int:
    """Print the value a shell script asks for."""
    answers = {
        "version": lambda: LLAMA_CPP_VERSION,
        "cmake-args": lambda: CMAKE_ARGS,
        "wheelhouse": lambda: str(wheelhouse()),
        "tools-dir": lambda: str(tools_dir()),
    }
    if len(argv) != 1 or argv[0] not in answers:
        print(f"usage: llama_build.py {'|'.join(answers)}", file=sys.stderr)
        return 2
    print(answers[argv[0]]())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
