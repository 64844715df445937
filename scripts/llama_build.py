"""The one place that names the llama.cpp build every install path uses.

scripts/install, scripts/build-llama-tools and noxfile.py read the pinned llama-cpp-python version,
its CMake flags and the cache directories from here, so a change of version or flags changes the
cache names everywhere at once (a wheel built with other flags is never picked up by mistake).

The build is for the accelerator that is there: CUDA where an NVIDIA GPU answers and nvcc is
installed, HIP where an AMD GPU answers and hipcc is, Vulkan where a GPU device exists and the Vulkan
headers and glslc are installed, Metal on Apple silicon, else the CPU. A toolkit without a GPU (nvcc
on a machine with no driver) is no reason to build for it. ``ANYFORMER_LLAMA_BACKEND`` forces one.
Only the standard library: it runs before any virtual environment exists.

    python3 scripts/llama_build.py version|cmake-args|wheelhouse|tools-dir|backend|flavour|why|library|env
"""

# No `from __future__ import annotations`: noxfile.py loads this file without registering it in
# sys.modules, and dataclasses then cannot resolve string annotations.
import dataclasses
import glob
import os
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

LLAMA_CPP_VERSION = "0.3.36"
#: Portable (AVX2 and below: -march=native segfaults on CPUs with AMX) and with llama.cpp's RPC
#: backend, so one model can span several hosts (docs/rpc.md). Every flavour starts with these.
CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_RPC=ON"
#: The CPU flavour's name in the cache directories (kept from before there were GPU flavours, so the
#: wheels and binaries already built stay valid).
FLAVOUR = "portable-rpc"
#: The environment variable that forces a backend, and the backends it may name.
BACKEND_ENV = "ANYFORMER_LLAMA_BACKEND"
BACKENDS = ("cpu", "cuda", "hip", "vulkan", "metal")
#: The CMake switch that turns each GPU backend on.
BACKEND_FLAGS = {
    "cuda": "-DGGML_CUDA=ON",
    "hip": "-DGGML_HIP=ON",
    "vulkan": "-DGGML_VULKAN=ON",
    "metal": "-DGGML_METAL=ON",
}


@dataclasses.dataclass(frozen=True)
class Machine:
    """What the detection may ask the machine; tests give stand-ins."""

    which: Callable[[str], str | None] = shutil.which
    exists: Callable[[str], bool] = os.path.exists
    glob: Callable[[str], list[str]] = glob.glob
    system: str = platform.system()
    arch: str = platform.machine()
    env: dict[str, str] = dataclasses.field(default_factory=lambda: dict(os.environ))

    def output(self, argv: list[str]) -> str | None:
        """A command's stdout, or None when it is missing, fails or hangs."""
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None


@dataclasses.dataclass(frozen=True)
class Build:
    """One llama-cpp-python build: its backend, CMake flags, cache flavour and why it was chosen."""

    backend: str
    cmake_args: str
    flavour: str
    why: str

    @property
    def wheelhouse(self) -> Path:
        """The directory holding the llama-cpp-python wheel built with these flags."""
        return cache_root() / f"llama-cpp-python-{LLAMA_CPP_VERSION}-{self.flavour}"

    @property
    def tools_dir(self) -> Path:
        """The directory holding llama.cpp's ggml-rpc-server and llama-server built with these flags."""
        return cache_root() / f"llama-cpp-tools-{LLAMA_CPP_VERSION}-{self.flavour}"

    @property
    def library(self) -> str:
        """The ggml library an installed build of this flavour has (``ggml-rpc`` for the CPU one)."""
        return "ggml-rpc" if self.backend == "cpu" else f"ggml-{self.backend}"


def cache_root() -> Path:
    """Where built wheels and binaries are kept: ``$ANYFORMER_WHEELHOUSE`` or ~/.cache/anyformer-wheelhouse."""
    return Path(os.environ.get("ANYFORMER_WHEELHOUSE") or Path.home() / ".cache" / "anyformer-wheelhouse")


def _tool(machine: Machine, name: str, *homes: str) -> str | None:
    """``name`` on PATH, else in ``bin/`` of one of the toolkit homes (``$CUDA_HOME``, /usr/local/cuda…)."""
    found = machine.which(name)
    if found:
        return found
    for home in homes:
        if home and machine.exists(f"{home}/bin/{name}"):
            return f"{home}/bin/{name}"
    return None


def nvidia_gpu(machine: Machine) -> tuple[str, str | None] | None:
    """(the first NVIDIA GPU's name, its compute capability as ``90``), or None where no driver answers.

    The driver must list a device: nvcc alone (a build machine, a container without the GPU) is no GPU.
    """
    smi = machine.which("nvidia-smi")
    answer = machine.output([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"]) if smi else None
    if answer and answer.strip():
        name, _, capability = answer.strip().splitlines()[0].partition(",")
        digits = capability.strip().replace(".", "")
        return name.strip(), digits if digits.isdigit() else None
    if machine.exists("/proc/driver/nvidia/version") and machine.glob("/dev/nvidia[0-9]*"):
        return "an NVIDIA GPU", None
    return None


def amd_gpu(machine: Machine) -> tuple[str, str | None] | None:
    """(an AMD GPU's description, its gfx target), or None where ROCm's kernel driver shows none."""
    if not machine.exists("/dev/kfd"):
        return None
    rocminfo = _tool(machine, "rocminfo", machine.env.get("ROCM_PATH", ""), "/opt/rocm")
    answer = machine.output([rocminfo]) if rocminfo else None
    targets = sorted({word for word in (answer or "").split() if word.startswith("gfx") and word[3:].isalnum()})
    # gfx000 is the CPU agent rocminfo lists too.
    targets = [t for t in targets if t != "gfx000"]
    if targets:
        return f"an AMD GPU ({targets[0]})", targets[0]
    return ("an AMD GPU", None) if machine.glob("/dev/dri/renderD*") else None


def render_device(machine: Machine) -> bool:
    """Whether a GPU render device exists (Linux's /dev/dri/renderD*; Windows: assumed where a driver is)."""
    if machine.system == "Windows":
        return bool(machine.env.get("VULKAN_SDK"))
    return bool(machine.glob("/dev/dri/renderD*"))


def vulkan_toolkit(machine: Machine) -> bool:
    """The Vulkan headers and the glslc shader compiler llama.cpp's Vulkan backend builds with."""
    sdk = machine.env.get("VULKAN_SDK", "")
    roots = ([f"{sdk}/include"] if sdk else []) + ["/usr/include", "/usr/local/include"]
    headers = any(machine.exists(f"{root}/vulkan/vulkan.h") for root in roots)
    return headers and _tool(machine, "glslc", sdk) is not None


def _with_rpc(*flags: str) -> str:
    return " ".join([CMAKE_ARGS, *flags])


def build_for(backend: str, machine: Machine, why: str) -> Build:
    """The build of ``backend``, with the CUDA architecture or HIP target of the GPU found (if any)."""
    if backend == "cpu":
        return Build("cpu", CMAKE_ARGS, FLAVOUR, why)
    flags = [BACKEND_FLAGS[backend]]
    flavour = backend
    if backend == "cuda":
        gpu = nvidia_gpu(machine)
        nvcc = _tool(machine, "nvcc", machine.env.get("CUDA_HOME", ""), "/usr/local/cuda")
        if nvcc and not machine.which("nvcc"):
            flags.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
        # Built for the GPU found (minutes instead of every architecture's tens of minutes).
        if gpu is not None and gpu[1]:
            flags.append(f"-DCMAKE_CUDA_ARCHITECTURES={gpu[1]}")
            flavour = f"cuda-sm{gpu[1]}"
    elif backend == "hip":
        gpu = amd_gpu(machine)
        if gpu is not None and gpu[1]:
            flags.append(f"-DAMDGPU_TARGETS={gpu[1]}")
            flavour = f"hip-{gpu[1]}"
    return Build(backend, _with_rpc(*flags), f"{flavour}-rpc", why)


def choose(machine: Machine | None = None) -> Build:
    """The build for this machine, with one line saying why (and, for a CPU build, what a GPU one needs)."""
    machine = machine or Machine()
    forced = machine.env.get(BACKEND_ENV, "").strip().lower()
    if forced:
        if forced not in BACKENDS:
            raise ValueError(f"{BACKEND_ENV}={forced} is not one of {', '.join(BACKENDS)}")
        return build_for(forced, machine, f"{forced}: set by {BACKEND_ENV}")
    if machine.system == "Darwin":
        if machine.arch == "arm64":
            return build_for("metal", machine, "metal: Apple silicon (Metal is part of macOS)")
        return build_for("cpu", machine, "cpu: an Intel Mac (llama.cpp's Metal backend is for Apple silicon)")
    missing: list[str] = []
    nvidia = nvidia_gpu(machine)
    if nvidia is not None:
        nvcc = _tool(machine, "nvcc", machine.env.get("CUDA_HOME", ""), "/usr/local/cuda")
        if nvcc:
            return build_for("cuda", machine, f"cuda: {nvidia[0]} with the CUDA toolkit ({nvcc})")
        missing.append(f"{nvidia[0]} found but no CUDA toolkit (install it for nvcc)")
    amd = amd_gpu(machine)
    if amd is not None:
        hipcc = _tool(machine, "hipcc", machine.env.get("ROCM_PATH", ""), "/opt/rocm")
        if hipcc:
            return build_for("hip", machine, f"hip: {amd[0]} with ROCm ({hipcc})")
        missing.append(f"{amd[0]} found but no ROCm HIP toolkit (install rocm-hip-sdk for hipcc)")
    if nvidia is not None or amd is not None or render_device(machine):
        if vulkan_toolkit(machine):
            return build_for("vulkan", machine, "vulkan: a GPU device with the Vulkan headers and glslc")
        missing.append("for any GPU: the Vulkan headers and glslc (apt-get install libvulkan-dev glslc)")
        return build_for("cpu", machine, "cpu: " + "; ".join(missing) + f"; or force one with {BACKEND_ENV}")
    toolkits = [name for name in ("nvcc", "hipcc") if machine.which(name)]
    beside = f" ({' and '.join(toolkits)} installed, but no GPU driver lists a device)" if toolkits else ""
    return build_for("cpu", machine, f"cpu: no GPU found{beside}")


def wheelhouse() -> Path:
    """The directory holding the llama-cpp-python wheel built for this machine."""
    return choose().wheelhouse


def tools_dir() -> Path:
    """The directory holding llama.cpp's ggml-rpc-server and llama-server built for this machine."""
    return choose().tools_dir


def main(argv: list[str]) -> int:
    """Print the value a shell script asks for (``env``: all of them as shell assignments)."""
    fields = ("version", "cmake-args", "wheelhouse", "tools-dir", "backend", "flavour", "why", "library")
    if len(argv) != 1 or argv[0] not in (*fields, "env"):
        print(f"usage: llama_build.py {'|'.join((*fields, 'env'))}", file=sys.stderr)
        return 2
    if argv[0] == "version":
        print(LLAMA_CPP_VERSION)
        return 0
    try:
        build = choose()
    except ValueError as exc:
        print(f"anyformer: {exc}", file=sys.stderr)
        return 2
    answers = {
        "version": LLAMA_CPP_VERSION,
        "cmake-args": build.cmake_args,
        "wheelhouse": str(build.wheelhouse),
        "tools-dir": str(build.tools_dir),
        "backend": build.backend,
        "flavour": build.flavour,
        "why": build.why,
        "library": build.library,
    }
    if argv[0] == "env":
        for name, value in answers.items():
            print(f"{name.replace('-', '_')}={shlex.quote(value)}")
    else:
        print(answers[argv[0]])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
