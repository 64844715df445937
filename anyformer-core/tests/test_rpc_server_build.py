"""``anyformer rpc-server --build``: the RPC server built for a pip user from the llama-cpp-python sdist.

The real sdist takes minutes to compile on two cores, so a stand-in sdist is built instead: the
same layout (``llama_cpp_python-VERSION/vendor/llama.cpp/CMakeLists.txt``) holding a small C
program called ggml-rpc-server that prints the CMake flags it was configured with. CMake and the C
compiler really run; what is tested is the flags chosen for the installed build's flavour, where
the binary lands (where ``anyformer rpc-server`` looks), reuse, and the clean refusals.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.rpc import _server_binary, _server_build

VERSION = "0.3.36"
STAND_IN_CMAKE = """
cmake_minimum_required(VERSION 3.14)
project(stand_in C)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_executable(ggml-rpc-server server.c)
target_compile_definitions(ggml-rpc-server PRIVATE
  "FLAGS=\\"rpc=${GGML_RPC} native=${GGML_NATIVE} cuda=${GGML_CUDA} arch=${CMAKE_CUDA_ARCHITECTURES}\\"")
"""
STAND_IN_C = "#include <stdio.h>\nint main(void) { puts(FLAGS); return 0; }\n"

needs_a_compiler = pytest.mark.skipif(
    shutil.which("cmake") is None or shutil.which("cc") is None, reason="needs CMake and a C compiler"
)


def _stand_in_sdist(folder: Path, version: str = VERSION) -> Path:
    sdist = folder / f"llama_cpp_python-{version}.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        for name, text in (("CMakeLists.txt", STAND_IN_CMAKE), ("server.c", STAND_IN_C)):
            data = text.encode()
            member = tarfile.TarInfo(f"llama_cpp_python-{version}/vendor/llama.cpp/{name}")
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    return sdist


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str | None]:
    """llama-cpp-python VERSION 'installed', of the flavour the test sets; the wheelhouse in tmp_path."""
    build: dict[str, str | None] = {"backend": None, "architecture": None}
    monkeypatch.setenv("ANYFORMER_WHEELHOUSE", str(tmp_path / "wheelhouse"))
    for module in (_server_binary, _server_build):
        monkeypatch.setattr(module, "installed_version", lambda: VERSION)
        monkeypatch.setattr(module, "installed_gpu_backend", lambda: build["backend"])
    monkeypatch.setattr(_server_build, "nvidia_architecture", lambda: build["architecture"])
    return build


@needs_a_compiler
def test_a_cpu_build_lands_where_the_server_is_looked_for_and_is_reused(
    installed: dict[str, str | None], tmp_path: Path
) -> None:
    sdist = _stand_in_sdist(tmp_path)
    binary = _server_build.build_rpc_server(sdist, jobs=1)
    assert binary == tmp_path / "wheelhouse" / f"llama-cpp-tools-{VERSION}-portable-rpc" / "ggml-rpc-server"
    assert (
        subprocess.run([str(binary)], capture_output=True, text=True)
        .stdout.strip()
        .startswith("rpc=ON native=OFF cuda= ")
    )
    assert _server_binary.tools_dir() == binary.parent
    assert "-DGGML_RPC=ON" in (binary.parent / "BUILD_INFO").read_text()
    sdist.unlink()  # a second call builds nothing, so needs no source
    assert _server_build.build_rpc_server(sdist, jobs=1) == binary


@needs_a_compiler
def test_a_cuda_install_gets_a_cuda_server_for_the_gpus_architecture(
    installed: dict[str, str | None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed.update(backend="cuda", architecture="90")
    binary = _server_build.build_rpc_server(_stand_in_sdist(tmp_path), jobs=1)
    assert binary.parent.name == f"llama-cpp-tools-{VERSION}-cuda-sm90-rpc"
    printed = subprocess.run([str(binary)], capture_output=True, text=True).stdout.strip()
    assert printed == "rpc=ON native=OFF cuda=ON arch=90"
    assert _server_binary.tools_dir() == binary.parent  # found without asking nvidia-smi again
    monkeypatch.setenv("PATH", "/nonexistent")
    assert _server_binary.find_rpc_server() == binary


def test_the_flavour_names_agree_with_the_checkouts_build_script() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "llama_build", Path(__file__).resolve().parents[2] / "scripts" / "llama_build.py"
    )
    assert spec is not None and spec.loader is not None
    llama_build = importlib.util.module_from_spec(spec)
    sys.modules["llama_build"] = llama_build
    spec.loader.exec_module(llama_build)
    assert _server_binary.tools_flavour(None) == llama_build.FLAVOUR
    assert _server_build.GPU_FLAGS == llama_build.BACKEND_FLAGS
    assert " ".join(_server_build.COMMON_FLAGS) == llama_build.CMAKE_ARGS
    assert _server_binary.tools_flavour("cuda", "90") == "cuda-sm90-rpc"
    assert _server_binary.tools_flavour("vulkan") == "vulkan-rpc"


def test_no_llama_cpp_python_is_no_backend(installed: dict[str, str | None], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_server_build, "installed_version", lambda: None)
    with pytest.raises(AnyformerError) as caught:
        _server_build.build_rpc_server()
    assert caught.value.code is ErrorCode.NO_BACKEND and "pip install anyformer-llamacpp" in str(caught.value)


@needs_a_compiler
@pytest.mark.parametrize("problem", ["missing", "not a tarball", "another version"])
def test_a_wrong_sdist_is_a_bad_request(installed: dict[str, str | None], tmp_path: Path, problem: str) -> None:
    sdist = tmp_path / "x.tar.gz"
    if problem == "not a tarball":
        sdist.write_bytes(b"not gzip")
    elif problem == "another version":
        sdist = _stand_in_sdist(tmp_path, "0.3.1")
    with pytest.raises(AnyformerError) as caught:
        _server_build.build_rpc_server(sdist, jobs=1)
    assert caught.value.code is ErrorCode.BAD_REQUEST
    assert not any((tmp_path / "wheelhouse").glob("llama-cpp-tools-*-portable-rpc")), "nothing half-built is left"


def test_without_cmake_it_names_what_to_install(installed: dict[str, str | None], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(_server_build.shutil, "which", lambda name: None)
    with pytest.raises(AnyformerError) as caught:
        _server_build.build_rpc_server(_stand_in_sdist(tmp_path))
    assert caught.value.code is ErrorCode.NO_BACKEND and "cmake" in str(caught.value)


def test_the_cli_refuses_sdist_without_build(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "anyformer", "rpc-server", "--sdist", str(tmp_path / "x.tar.gz")],
        capture_output=True, text=True, timeout=60, env={**os.environ, "ANYFORMER_WHEELHOUSE": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 2 and "BAD_REQUEST" in done.stderr and "--build" in done.stderr
