"""scripts/llama_build.py: which llama.cpp build an install makes, with every tool it asks mocked.

The machine is a stand-in (``Machine`` with fake ``which``/``exists``/``glob`` and canned command
output), so each vendor's answer is tested here, where none of them is installed.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("llama_build", REPO / "scripts" / "llama_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["llama_build"] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


llama_build = _load()


class FakeMachine(llama_build.Machine):  # type: ignore[misc,name-defined]
    """A machine whose tools, files and command answers are given."""

    def __init__(
        self,
        *,
        tools: dict[str, str] | None = None,
        files: tuple[str, ...] = (),
        outputs: dict[str, str] | None = None,
        system: str = "Linux",
        arch: str = "x86_64",
        env: dict[str, str] | None = None,
    ) -> None:
        tools = tools or {}
        outputs = outputs or {}
        super().__init__(
            which=tools.get,
            exists=lambda path: path in files,
            glob=lambda pattern: [f for f in files if Path(f).match(pattern)],
            system=system,
            arch=arch,
            env=env or {},
        )
        object.__setattr__(self, "_outputs", outputs)
        object.__setattr__(self, "asked", [])

    def output(self, argv: list[str]) -> str | None:
        self.asked.append(argv)
        return self._outputs.get(Path(argv[0]).name)


H200 = {"nvidia-smi": "NVIDIA H200, 9.0\n"}


def test_this_machines_case_nvcc_without_a_gpu_builds_for_the_cpu_and_says_why() -> None:
    build = llama_build.choose(FakeMachine(tools={"nvcc": "/usr/local/bin/nvcc"}))
    assert build.backend == "cpu"
    assert build.cmake_args == "-DGGML_NATIVE=OFF -DGGML_RPC=ON"
    assert "no GPU found" in build.why and "nvcc" in build.why


def test_the_cpu_flavour_keeps_the_cache_names_built_before_gpu_flavours(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYFORMER_WHEELHOUSE", "/cache")
    build = llama_build.choose(FakeMachine())
    assert build.wheelhouse == Path("/cache/llama-cpp-python-0.3.36-portable-rpc")
    assert build.tools_dir == Path("/cache/llama-cpp-tools-0.3.36-portable-rpc")
    assert build.library == "ggml-rpc"


def test_an_nvidia_gpu_with_nvcc_builds_cuda_for_its_architecture_with_rpc_kept() -> None:
    machine = FakeMachine(tools={"nvidia-smi": "/usr/bin/nvidia-smi", "nvcc": "/usr/local/cuda/bin/nvcc"}, outputs=H200)
    build = llama_build.choose(machine)
    assert build.backend == "cuda"
    assert build.cmake_args.split() == [
        "-DGGML_NATIVE=OFF",
        "-DGGML_RPC=ON",
        "-DGGML_CUDA=ON",
        "-DCMAKE_CUDA_ARCHITECTURES=90",
    ]
    assert build.flavour == "cuda-sm90-rpc" and build.library == "ggml-cuda"
    assert "NVIDIA H200" in build.why
    assert ["/usr/bin/nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"] in machine.asked


def test_nvcc_outside_path_is_found_in_the_cuda_home_and_named_to_cmake() -> None:
    machine = FakeMachine(
        tools={"nvidia-smi": "/usr/bin/nvidia-smi"}, files=("/usr/local/cuda/bin/nvcc",), outputs=H200
    )
    build = llama_build.choose(machine)
    assert build.backend == "cuda" and "-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc" in build.cmake_args


def test_an_nvidia_gpu_without_a_toolkit_builds_for_the_cpu_and_names_what_to_install() -> None:
    build = llama_build.choose(FakeMachine(tools={"nvidia-smi": "/usr/bin/nvidia-smi"}, outputs=H200))
    assert build.backend == "cpu" and build.flavour == "portable-rpc"
    assert "NVIDIA H200 found but no CUDA toolkit" in build.why
    assert "glslc" in build.why and "ANYFORMER_LLAMA_BACKEND" in build.why


def test_a_driver_that_nvidia_smi_does_not_answer_for_still_counts_through_its_device_files() -> None:
    machine = FakeMachine(tools={"nvcc": "/usr/bin/nvcc"}, files=("/proc/driver/nvidia/version", "/dev/nvidia0"))
    build = llama_build.choose(machine)
    assert build.backend == "cuda" and build.flavour == "cuda-rpc"  # no architecture known: llama.cpp's default set


def test_an_amd_gpu_with_hipcc_builds_hip_for_its_gfx_target() -> None:
    machine = FakeMachine(
        tools={"hipcc": "/opt/rocm/bin/hipcc", "rocminfo": "/opt/rocm/bin/rocminfo"},
        files=("/dev/kfd", "/dev/dri/renderD128"),
        outputs={"rocminfo": "Agent 1\n  Name: gfx000\nAgent 2\n  Name:  gfx1100\n"},
    )
    build = llama_build.choose(machine)
    assert build.backend == "hip"
    assert "-DGGML_HIP=ON" in build.cmake_args and "-DAMDGPU_TARGETS=gfx1100" in build.cmake_args
    assert build.flavour == "hip-gfx1100-rpc"


def test_any_gpu_device_with_vulkan_headers_and_glslc_builds_vulkan() -> None:
    machine = FakeMachine(
        tools={"glslc": "/usr/bin/glslc"}, files=("/dev/dri/renderD128", "/usr/include/vulkan/vulkan.h")
    )
    build = llama_build.choose(machine)
    assert build.backend == "vulkan" and "-DGGML_VULKAN=ON" in build.cmake_args and build.flavour == "vulkan-rpc"


def test_vulkan_headers_without_a_gpu_device_build_for_the_cpu() -> None:
    machine = FakeMachine(tools={"glslc": "/usr/bin/glslc"}, files=("/usr/include/vulkan/vulkan.h",))
    assert llama_build.choose(machine).backend == "cpu"


def test_a_gpu_device_without_glslc_says_which_vulkan_packages_to_install() -> None:
    machine = FakeMachine(files=("/dev/dri/renderD128", "/usr/include/vulkan/vulkan.h"))
    build = llama_build.choose(machine)
    assert build.backend == "cpu" and "libvulkan-dev glslc" in build.why


def test_apple_silicon_builds_metal_and_an_intel_mac_the_cpu() -> None:
    metal = llama_build.choose(FakeMachine(system="Darwin", arch="arm64"))
    assert metal.backend == "metal" and "-DGGML_METAL=ON" in metal.cmake_args and metal.flavour == "metal-rpc"
    assert llama_build.choose(FakeMachine(system="Darwin", arch="x86_64")).backend == "cpu"


@pytest.mark.parametrize("backend", ["cpu", "cuda", "hip", "vulkan", "metal"])
def test_the_environment_variable_forces_a_backend_whatever_is_found(backend: str) -> None:
    machine = FakeMachine(
        tools={"nvidia-smi": "/usr/bin/nvidia-smi", "nvcc": "/usr/bin/nvcc"},
        outputs=H200,
        env={"ANYFORMER_LLAMA_BACKEND": backend.upper()},
    )
    build = llama_build.choose(machine)
    assert build.backend == backend and "ANYFORMER_LLAMA_BACKEND" in build.why
    assert build.cmake_args.startswith("-DGGML_NATIVE=OFF -DGGML_RPC=ON")


def test_an_unknown_forced_backend_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="cpu, cuda, hip, vulkan, metal"):
        llama_build.choose(FakeMachine(env={"ANYFORMER_LLAMA_BACKEND": "opencl"}))


def test_the_script_prints_shell_assignments_and_refuses_a_bad_backend(tmp_path: Path) -> None:
    script = str(REPO / "scripts" / "llama_build.py")
    env = {"PATH": "/usr/bin:/bin", "ANYFORMER_WHEELHOUSE": str(tmp_path), "ANYFORMER_LLAMA_BACKEND": "vulkan"}
    done = subprocess.run([sys.executable, script, "env"], capture_output=True, text=True, env=env, check=True)
    values = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert values["backend"] == "vulkan" and values["library"] == "ggml-vulkan"
    assert values["cmake_args"] == "'-DGGML_NATIVE=OFF -DGGML_RPC=ON -DGGML_VULKAN=ON'"
    assert values["wheelhouse"] == str(tmp_path / "llama-cpp-python-0.3.36-vulkan-rpc")
    bad = subprocess.run(
        [sys.executable, script, "env"], capture_output=True, text=True, env={**env, "ANYFORMER_LLAMA_BACKEND": "x"}
    )
    assert bad.returncode == 2 and "is not one of" in bad.stderr and bad.stdout == ""


def test_the_script_loads_as_noxfile_loads_it_without_a_sys_modules_entry() -> None:
    spec = importlib.util.spec_from_file_location("llama_build_as_nox_loads_it", REPO / "scripts" / "llama_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.choose(FakeMachine()).backend == "cpu"
