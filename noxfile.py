"""Sessions that install and test every anyformer package (``nox --list`` shows them).

Every session installs what users install (the packages from their folders, not an editable
checkout), so a missing dependency or package-data file fails here first. llama-cpp-python
compiles from source; it is built once into a wheelhouse that every session installs from.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CORE = "anyformer-core"
CONFORMANCE = "conformance"
PLUGINS = {"llamacpp": "plugins/anyformer-llamacpp", "template": "plugins/_template"}
PACKAGES = {"core": CORE, "conformance": CONFORMANCE, **PLUGINS}
TEST_TOOLS = ["pytest>=8", "gguf>=0.19", "numpy>=1.24", "hypothesis>=6", "safetensors>=0.4", "wgpu>=0.19"]
#: What the core's server tests add: the real OpenAI client, and Playwright (driving Debian's chromium).
SERVER_TEST_TOOLS = ["openai>=1.40", "playwright>=1.45"]
LLAMA_CPP_VERSION = "0.3.36"
# A portable build (AVX2 and below): a -march=native build on CPUs with AMX segfaults on batched
# decoding of Q4 models in llama.cpp 0.3.36's CPU backend (seen on the CI machines).
LLAMA_CPP_CMAKE_ARGS = "-DGGML_NATIVE=OFF"
WHEELHOUSE = (
    Path(os.environ.get("ANYFORMER_WHEELHOUSE", Path.home() / ".cache" / "anyformer-wheelhouse"))
    / f"llama-cpp-python-{LLAMA_CPP_VERSION}-portable"
)

nox.options.sessions = ["lint", "tests", "conformance"]
nox.options.reuse_existing_virtualenvs = True


def ensure_llama_wheel(session: nox.Session) -> None:
    """Build llama-cpp-python once into the wheelhouse (about 4-7 minutes on 2 cores)."""
    if any(WHEELHOUSE.glob(f"llama_cpp_python-{LLAMA_CPP_VERSION}-*.whl")):
        return
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    session.log(f"building llama-cpp-python {LLAMA_CPP_VERSION} into {WHEELHOUSE} (once)")
    session.run(
        "python",
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-cache-dir",
        "-w",
        str(WHEELHOUSE),
        f"llama-cpp-python=={LLAMA_CPP_VERSION}",
        env={"CMAKE_ARGS": LLAMA_CPP_CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)},
    )


def install(session: nox.Session, *folders: str, extra: list[str] | None = None) -> None:
    """Install packages from their folders (with the prebuilt llama-cpp-python) plus the test tools."""
    if any("llamacpp" in folder for folder in folders):
        ensure_llama_wheel(session)
    session.install("--find-links", str(WHEELHOUSE), *(str(ROOT / f) for f in folders), *TEST_TOOLS, *(extra or []))


@nox.session
def lint(session: nox.Session) -> None:
    """Check style and common mistakes with ruff."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")


@nox.session
@nox.parametrize("package", list(PACKAGES))
def tests(session: nox.Session, package: str) -> None:
    """Run one package's own tests (the conformance kit runs in its own session)."""
    folder = PACKAGES[package]
    needs = {CORE, CONFORMANCE, folder}
    if package == "core":
        # The server's tests: the serve extra, the real openai client, Playwright on Debian's chromium,
        # and the llama.cpp backend for the embedded SmolLM2.
        needs.add(PLUGINS["llamacpp"])
        install(session, *sorted(needs), extra=[f"{ROOT / CORE}[serve]", *SERVER_TEST_TOOLS])
    else:
        install(session, *sorted(needs))
    session.run(
        "pytest", f"{folder}/tests", "-p", "no:cacheprovider", "--ignore-glob=*test_conformance.py", *session.posargs
    )


@nox.session
@nox.parametrize("plugin", list(PLUGINS))
def conformance(session: nox.Session, plugin: str) -> None:
    """Run the conformance kit against one backend, installed the way users install it."""
    folder = PLUGINS[plugin]
    install(session, CORE, CONFORMANCE, folder)
    session.run("pytest", f"{folder}/tests/test_conformance.py", "-p", "no:cacheprovider", *session.posargs)


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


@nox.session
def fuzz(session: nox.Session) -> None:
    """Fuzz describe and the header validators with atheris: 100,000 mutated GGUF/safetensors/ONNX inputs."""
    install(session, CORE, extra=["atheris>=2.3"])
    session.run("python", "anyformer-core/fuzz/fuzz_model_files.py", *(session.posargs or ["-runs=100000"]))
