"""Shared fixtures for the core's tests: real plugin distributions on disk, and in-process backends."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

import anyformer
from anyformer import Caps, Chunk, Estimate, Rank, Verdict, hookimpl
from anyformer._plugins import reset_plugin_manager
from anyformer.plugin import BackendModel, Features

#: A what-if model description: one GGUF of 100 MB (the shape of docs/contract.md ("Model description")).
MODEL_DESCRIPTION: dict[str, Any] = {
    "repo": "test-org/tiny-llama-GGUF",
    "revision": "main",
    "architecture": "llama",
    "task": "text-generation",
    "tags": ["gguf"],
    "files": [{"name": "tiny-Q4_0.gguf", "size": 100_000_000}],
}


@pytest.fixture(autouse=True)
def _plugin_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No plugin filter leaks in from the caller's shell, and no process-wide manager leaks out."""
    monkeypatch.delenv("ANYFORMER_PLUGINS", raising=False)
    monkeypatch.delenv("ANYFORMER_DISABLE_PLUGINS", raising=False)
    reset_plugin_manager()
    yield
    reset_plugin_manager()


@pytest.fixture
def model_description() -> dict[str, Any]:
    """A fresh copy of :data:`MODEL_DESCRIPTION`."""
    return json.loads(json.dumps(MODEL_DESCRIPTION))


# ---- real distributions on disk ------------------------------------------------------------------


class DistributionFolder:
    """A folder on ``sys.path`` where tests write tiny installed distributions (``*.dist-info``).

    ``importlib.metadata`` finds them exactly as it finds pip-installed ones, so the plugin host
    is exercised through real entry points, distributions and versions.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: set[str] = set()
        #: For a prepared set: backend id -> (distribution, version).
        self.expected: dict[str, tuple[str, str]] = {}

    @property
    def only_these(self) -> dict[str, str]:
        """The environment that limits loading to this folder's backends (other plugins may be installed)."""
        return {"ANYFORMER_PLUGINS": ",".join(self.expected)}

    def add(
        self,
        distribution: str,
        version: str,
        entry_points: dict[str, str],
        modules: dict[str, str] | None = None,
    ) -> None:
        """Write a distribution with ``anyformer`` entry points and the modules it ships."""
        info = self.root / f"{distribution.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
        lines = ["[anyformer]", *(f"{name} = {value}" for name, value in entry_points.items())]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        for module, source in (modules or {}).items():
            (self.root / f"{module}.py").write_text(textwrap.dedent(source))
            self.modules.add(module)
        importlib.invalidate_caches()


@pytest.fixture
def distributions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DistributionFolder]:
    """An empty :class:`DistributionFolder` on ``sys.path``; its modules are forgotten afterwards."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    folder = DistributionFolder(root)
    yield folder
    for module in folder.modules:
        sys.modules.pop(module, None)
    importlib.invalidate_caches()


_HEALTHY = """
from anyformer import Estimate, Rank, Refusal, Verdict, hookimpl

@hookimpl
def can_run(model, caps, request):
    size = sum(f.size or 0 for f in model.files_of("gguf"))
    if not size:
        return Verdict.refuse("healthy", Refusal.FORMAT, "no GGUF in the repo")
    if not caps.gpu:
        return Verdict.refuse("healthy", Refusal.GPU, "needs a GPU adapter")
    if size > (request.budget or 0):
        return Verdict.refuse("healthy", Refusal.BUDGET, f"needs {size} bytes of GPU memory", need=size)
    return Verdict.accept("healthy", Estimate(gpu_bytes=size, ram_bytes=10**6, tok_per_sec=50.0, rank=Rank.SPECIALIST))
"""

_RAISES_IN_CAN_RUN = """
from anyformer import hookimpl

class Plugin:
    @hookimpl
    def can_run(self, model):
        raise RuntimeError("engine exploded while looking at " + model.repo)

plugin = Plugin()
"""

_MISSPELT = """
from anyformer import Verdict, hookimpl

@hookimpl
def can_runn(model, caps, request):
    return Verdict.accept("misspelt")
"""

#: The standard broken-plugin set (SAFETY.md L1–L4): backend id -> (distribution, version).
BROKEN_SET = {
    "healthy": ("aftest-healthy", "1.0.0"),
    "raises-in-can-run": ("aftest-raiser", "2.1.0"),
    "raises-at-import": ("aftest-import-error", "0.3.1"),
    "exits-at-import": ("aftest-exit", "0.0.7"),
    "missing-module": ("aftest-missing", "4.0"),
    "misspelt-hook": ("aftest-misspelt", "1.1"),
}


def write_broken_set(folder: DistributionFolder) -> None:
    """One healthy plugin and one of each broken kind, each its own distribution."""
    folder.add("aftest-healthy", "1.0.0", {"healthy": "aftest_healthy"}, {"aftest_healthy": _HEALTHY})
    folder.add(
        "aftest-raiser", "2.1.0", {"raises-in-can-run": "aftest_raiser:plugin"}, {"aftest_raiser": _RAISES_IN_CAN_RUN}
    )
    folder.add(
        "aftest-import-error",
        "0.3.1",
        {"raises-at-import": "aftest_import_error"},
        {"aftest_import_error": 'raise RuntimeError("libengine.so: cannot open shared object file")\n'},
    )
    folder.add("aftest-exit", "0.0.7", {"exits-at-import": "aftest_exit"}, {"aftest_exit": "import sys\nsys.exit(7)\n"})
    folder.add("aftest-missing", "4.0", {"missing-module": "aftest_no_such_module"})
    folder.add("aftest-misspelt", "1.1", {"misspelt-hook": "aftest_misspelt"}, {"aftest_misspelt": _MISSPELT})


@pytest.fixture
def broken_set(distributions: DistributionFolder) -> DistributionFolder:
    """A :class:`DistributionFolder` holding :data:`BROKEN_SET`."""
    write_broken_set(distributions)
    distributions.expected = dict(BROKEN_SET)
    return distributions


# ---- running the CLI -----------------------------------------------------------------------------


@dataclasses.dataclass
class CliResult:
    """What ``python -m anyformer`` did."""

    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        """stdout parsed as JSON."""
        return json.loads(self.stdout)


@pytest.fixture
def run_cli(tmp_path: Path) -> Callable[..., CliResult]:
    """Run ``python -m anyformer ARGS`` in a subprocess.

    ``path`` goes first on PYTHONPATH; ``plugins`` puts a :class:`DistributionFolder` there and
    loads only its backends, whatever else is installed.
    """

    def run(
        *args: str,
        path: Path | None = None,
        plugins: DistributionFolder | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> CliResult:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("ANYFORMER_")}
        environment["ANYFORMER_HOME"] = str(tmp_path / "anyformer-home")
        environment["HF_HUB_OFFLINE"] = "1"
        if plugins is not None:
            path = plugins.root
            environment.update(plugins.only_these)
        if path is not None:
            environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), os.environ.get("PYTHONPATH")]))
        environment.update(env or {})
        done = subprocess.run(
            [sys.executable, "-m", "anyformer", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=environment,
            cwd=cwd or tmp_path,
            check=False,
        )
        return CliResult(done.returncode, done.stdout, done.stderr)

    return run


# ---- in-process backends -------------------------------------------------------------------------


class FakeHandle(BackendModel):
    """A loaded model of :class:`ScriptedBackend`, which generates for it; counts ``dispose`` calls.

    It honours ``top_p``/``top_k`` unless the backend gives it other ``features``.
    """

    features = Features(honours=frozenset({"top_p", "top_k"}))

    def __init__(self, owner: ScriptedBackend, task: str) -> None:
        self.owner = owner
        self.backend = owner.name
        self.task = task
        self.disposed = 0
        if owner.features is not None:
            self.features = owner.features

    def generate(self, messages: Any, options: Any) -> Iterator[Chunk]:
        return self.owner.generate_on(self, messages, options)

    def dispose(self) -> None:
        self.disposed += 1


class FakeRunHandle(FakeHandle):
    """A handle for a non-generation task: ``run`` echoes its input and options."""

    def run(self, input: Any, **options: Any) -> Any:
        return {"input": input, "options": options}


class ScriptedBackend:
    """An in-process backend whose ``generate`` plays a script of chunks and records what happened.

    ``script`` is a list of chunks, or a callable ``(options) -> iterable of chunks``. ``started``
    counts generate hook calls, ``yielded`` chunks handed to the core, ``closed`` how many times
    the backend iterator's ``finally`` ran.
    """

    def __init__(
        self,
        name: str = "fake",
        script: Iterable[Chunk] | Callable[[Any], Iterable[Chunk]] = (),
        *,
        estimate: Estimate | None = None,
        handle: type[FakeHandle] = FakeHandle,
        features: Features | None = None,
    ) -> None:
        self.name = name
        self.script = script
        self.estimate = estimate or Estimate(ram_bytes=10**6, tok_per_sec=10.0, rank=Rank.GENERAL)
        self.handle_type = handle
        #: What its handles declare (None: :class:`FakeHandle`'s own).
        self.features = features
        self.handles: list[FakeHandle] = []
        self.started = 0
        self.yielded = 0
        self.closed = 0
        self.last_options: Any = None
        self.last_messages: Any = None

    @hookimpl
    def can_run(self, model: Any, caps: Any, request: Any) -> Verdict:
        return Verdict.accept(self.name, self.estimate)

    @hookimpl
    def load(self, model: Any, request: Any) -> FakeHandle:
        handle = self.handle_type(self, model.task or "text-generation")
        self.handles.append(handle)
        return handle

    def generate_on(self, loaded: Any, messages: Any, options: Any) -> Iterator[Chunk]:
        """What its handles' ``generate`` returns: the script played, counted."""
        self.started += 1
        self.last_messages, self.last_options = messages, options
        return self._play(options)

    def _play(self, options: Any) -> Iterator[Chunk]:
        chunks = self.script(options) if callable(self.script) else self.script
        try:
            for chunk in chunks:
                self.yielded += 1
                yield chunk
        finally:
            self.closed += 1


def endless(options: Any) -> Iterator[Chunk]:
    """A script that never ends by itself: one word per token, forever."""
    tokens = 0
    while True:
        tokens += 1
        yield Chunk(delta=f"w{tokens} ", tokens=tokens)


@pytest.fixture
def load_scripted(model_description: dict[str, Any]) -> Callable[..., tuple[anyformer.Loaded, ScriptedBackend]]:
    """Register a :class:`ScriptedBackend` in a fresh manager and load the test model on it."""

    def load(
        script: Iterable[Chunk] | Callable[[Any], Iterable[Chunk]] = (),
        *,
        runnable: bool = False,
        features: Features | None = None,
    ) -> tuple[anyformer.Loaded, ScriptedBackend]:
        backend = ScriptedBackend("fake", script, handle=FakeRunHandle if runnable else FakeHandle, features=features)
        manager = anyformer.PluginManager()
        manager.register(backend, "fake")
        loaded = anyformer.load(model_description, caps=Caps(ram_bytes=16 * 2**30), plugins=manager)
        return loaded, backend

    return load


@pytest.fixture
def endless_script() -> Callable[[Any], Iterator[Chunk]]:
    """:func:`endless`: a script that streams until the core stops it."""
    return endless
