"""``anyformer rpc-server --build``: llama.cpp's rpc-server built for a pip user, same source and flavour.

The RPC protocol must match the llama.cpp that the llama.cpp backend runs, so the server is built
from the llama-cpp-python sdist of the installed version (``--sdist FILE``, or ``pip download``),
with the GPU backend the installed build has (its ``libggml-cuda``… library), portable and with
RPC, exactly as ``scripts/build-llama-tools`` builds it from a checkout. The binary lands in the
tools directory :func:`anyformer.rpc._server_binary.find_rpc_server` looks in, which appears only
once complete (built in a temporary directory beside it, then renamed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.rpc._server_binary import (
    NAMES,
    cache_root,
    installed_gpu_backend,
    installed_version,
    nvidia_architecture,
    tools_flavour,
)

#: Every build: portable CPU code (a -march=native build segfaults on CPUs with AMX) and RPC.
COMMON_FLAGS = ("-DGGML_NATIVE=OFF", "-DGGML_RPC=ON")
#: The CMake switch of each GPU backend (scripts/llama_build.py names the same for a checkout).
GPU_FLAGS = {"cuda": "-DGGML_CUDA=ON", "hip": "-DGGML_HIP=ON", "vulkan": "-DGGML_VULKAN=ON", "metal": "-DGGML_METAL=ON"}
#: What the server needs alone: no tests, examples, server, HTTPS or shared libraries.
_ONLY_THE_SERVER = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
)


def cmake_flags(backend: str | None, architecture: str | None) -> list[str]:
    """The flags for ``backend`` (None: the CPU), with the CUDA architecture when it is known."""
    flags = list(COMMON_FLAGS)
    if backend is not None:
        flags.append(GPU_FLAGS[backend])
    if backend == "cuda" and architecture:
        flags.append(f"-DCMAKE_CUDA_ARCHITECTURES={architecture}")
    return flags


def _need_tools() -> None:
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        raise AnyformerError(
            ErrorCode.NO_BACKEND,
            f"building llama.cpp's rpc-server needs {' and '.join(missing)}: install CMake and a C/C++ compiler "
            "(Debian: apt-get install cmake build-essential; macOS: xcode-select --install and brew install cmake)",
        )


def _download_sdist(version: str, into: Path) -> Path:
    """The llama-cpp-python sdist of ``version``, fetched with pip (its cache and index settings apply)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:", "--dest", str(into),
         f"llama-cpp-python=={version}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    found = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    if done.returncode != 0 or not found:
        last = (done.stderr.strip().splitlines() or ["no sdist"])[-1]
        raise AnyformerError(
            ErrorCode.DOWNLOAD_FAILED,
            f"could not download the llama-cpp-python {version} sdist ({last}); give one with --sdist FILE",
        )
    return found[0]


def _unpack(sdist: Path, version: str, into: Path) -> Path:
    """The llama.cpp source tree inside the sdist; BAD_REQUEST when the file is not that sdist."""
    try:
        with tarfile.open(sdist, "r:gz") as archive:
            if sys.version_info >= (3, 12):
                archive.extractall(into, filter="data")  # no links or paths out of the folder
            else:
                for member in archive.getmembers():
                    if (
                        member.issym()
                        or member.islnk()
                        or member.name.startswith("/")
                        or ".." in member.name.split("/")
                    ):
                        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{sdist}: unsafe member {member.name}")
                archive.extractall(into)
    except (OSError, tarfile.TarError) as exc:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{sdist} is not a llama-cpp-python sdist ({exc})") from exc
    source = into / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        raise AnyformerError(
            ErrorCode.BAD_REQUEST,
            f"{sdist} holds no llama_cpp_python-{version}/vendor/llama.cpp (the installed version)",
        )
    return source


def _run_logged(command: list[str], log: Path, what: str) -> None:
    with log.open("a", encoding="utf-8") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:])
        raise AnyformerError(ErrorCode.NO_BACKEND, f"{what} failed (exit {done.returncode}); the log's end:\n{tail}")


def build_rpc_server(sdist: Path | None = None, jobs: int | None = None) -> Path:
    """Build ggml-rpc-server for the installed llama-cpp-python and return its path (reused when built)."""
    version = installed_version()
    if version is None:
        raise AnyformerError(
            ErrorCode.NO_BACKEND, "llama-cpp-python is not installed: pip install anyformer-llamacpp first"
        )
    backend = installed_gpu_backend()
    architecture = nvidia_architecture() if backend == "cuda" else None
    dest = cache_root() / f"llama-cpp-tools-{version}-{tools_flavour(backend, architecture)}"
    if os.access(dest / NAMES[0], os.X_OK):
        return dest / NAMES[0]
    if sdist is not None and not sdist.is_file():
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"--sdist {sdist}: no such file")
    _need_tools()
    dest.parent.mkdir(parents=True, exist_ok=True)
    flags = cmake_flags(backend, architecture)
    print(
        f"anyformer: building llama.cpp's rpc-server (llama-cpp-python {version}, {' '.join(flags)}) into {dest}",
        file=sys.stderr,
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix=f"{dest.name}.tmp.", dir=dest.parent) as work_name:
        work = Path(work_name)
        source = _unpack(sdist or _download_sdist(version, work / "sdist"), version, work / "src")
        log = work / "build.log"
        build = work / "build"
        _run_logged(["cmake", "-S", str(source), "-B", str(build), *_ONLY_THE_SERVER, *flags], log, "configuring")
        parallel = str(jobs or os.cpu_count() or 2)
        _run_logged(
            ["cmake", "--build", str(build), "--config", "Release", "-j", parallel, "--target", NAMES[0]],
            log,
            "the build",
        )
        built = next((p for p in (build / "bin" / NAMES[0], build / "bin" / "Release" / NAMES[0]) if p.is_file()), None)
        if built is None:
            raise AnyformerError(ErrorCode.NO_BACKEND, f"the build made no {NAMES[0]} (log: {log})")
        out = work / "out"
        out.mkdir()
        shutil.copy2(built, out / NAMES[0])
        (out / "BUILD_INFO").write_text(f"llama-cpp-python {version}, {' '.join(flags)}\n", encoding="utf-8")
        if not os.access(dest / NAMES[0], os.X_OK):  # another build may have finished first: keep that one
            shutil.rmtree(dest, ignore_errors=True)
            out.rename(dest)
    return dest / NAMES[0]
