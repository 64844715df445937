"""The import graph of every package on disk, as a test: no cycles, and the layer rules.

Every ``src/`` folder is scanned (``anyformer-core/src``, ``conformance/src``, each ``plugins/*/src``), so
a new plugin folder is covered without being named here. Every import counts wherever it stands: at
module level, inside a function (a deferred import is a dependency that waits) and under ``if
TYPE_CHECKING`` (a type that names another module ties the two as much as a call does).

The rules:

- **no cycles** among the modules on disk;
- **the core in layers** (``CORE_LAYERS``, bottom first): the contract's types, then the services
  (files, store, machine probe, RPC), then the host (describe, plugins, selection, ``Loaded``,
  isolation, the public facades), then the CLI and the server; a module imports only its own layer
  and those below;
- **the core imports no plugin** and no kit;
- **a plugin imports from the core only** ``anyformer.plugin``, and another plugin folder's package only
  when that folder is a library (it registers no ``anyformer`` entry point) its ``pyproject.toml``
  depends on;
- **the kit** imports public ``anyformer`` modules only, and no plugin.

A failure names each cycle edge by edge, and each offending import, with its ``file:line``.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the development and CI interpreters are 3.11+
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
CORE_SRC = ROOT / "anyformer-core" / "src"
KIT_SRC = ROOT / "conformance" / "src"
PLUGINS = ROOT / "plugins"

#: The core's layers, bottom first: a module's layer is the one whose longest prefix names it, and it
#: may import modules of its own layer and of those below. ``anyformer`` (every module no other entry
#: names: ``_api``, ``_describe``, ``_plugins``, ``_selection``, ``_loaded``, ``isolation``, ``plugin``,
#: the package's own ``__init__``…) is the host.
CORE_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("contract", ("anyformer.contract",)),
    ("services", ("anyformer.files", "anyformer.store", "anyformer.machine", "anyformer.rpc")),
    ("host", ("anyformer",)),
    ("cli and server", ("anyformer.cli", "anyformer.server", "anyformer.__main__")),
)

#: The one core module a plugin imports (anyformer.hookspecs is read by pluggy, not by plugins).
PLUGIN_API = "anyformer.plugin"


@dataclasses.dataclass(frozen=True)
class Module:
    """One module on disk: its dotted name, its file and the folder (distribution) that holds it."""

    name: str
    path: Path
    folder: str

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


@dataclasses.dataclass(frozen=True)
class Import:
    """One import statement's target, seen from ``importer`` at ``line``.

    ``target`` is the module on disk it reaches (the longest dotted prefix found), or the name as
    written when it reaches no module on disk (a third-party package).
    """

    importer: Module
    target: str
    line: int

    def where(self) -> str:
        path = self.importer.path
        return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{self.line}"


def source_roots() -> list[tuple[str, Path]]:
    """``(folder, src)`` for every package folder on disk: the core, the kit and each plugin."""
    roots = [("anyformer-core", CORE_SRC), ("conformance", KIT_SRC)]
    roots += [(src.parent.name, src) for src in sorted(PLUGINS.glob("*/src"))]
    return roots


def find_modules(roots: Iterable[tuple[str, Path]]) -> dict[str, Module]:
    """Every ``.py`` file under the roots, by dotted name (a package by its folder's name)."""
    modules: dict[str, Module] = {}
    for folder, root in roots:
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = Module(".".join(parts), path, folder)
    return modules


def _on_disk(name: str, modules: dict[str, Module]) -> str:
    """The longest dotted prefix of ``name`` that is a module on disk, else ``name`` itself."""
    probe = name
    while probe and probe not in modules:
        probe = probe.rpartition(".")[0]
    return probe or name


def imports_of(module: Module, modules: dict[str, Module], source: str | None = None) -> list[Import]:
    """Every import in ``module`` (``source`` in its place, for tests), wherever it stands in the file."""
    return list(_scan(module, modules, module.path.read_text(encoding="utf-8") if source is None else source))


def scan(modules: dict[str, Module]) -> dict[str, list[Import]]:
    """Every module's imports, each file parsed once (the rules below all read them)."""
    return {name: imports_of(module, modules) for name, module in modules.items()}


def _scan(module: Module, modules: dict[str, Module], text: str) -> Iterator[Import]:
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for node in ast.walk(ast.parse(text, str(module.path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, _on_disk(alias.name, modules), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: level 1 is this package, each further level one up
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                # ``from pkg import sub`` reaches the submodule when there is one, else the package.
                named = f"{base}.{alias.name}"
                yield Import(module, named if named in modules else _on_disk(base, modules), node.lineno)


def import_graph(modules: dict[str, Module], imports: dict[str, list[Import]]) -> dict[str, list[Import]]:
    """Each module's imports of other modules on disk.

    A package's ``__init__`` importing its own submodules is left out: that is the package's surface
    (its re-exports), and every submodule that imports the package would otherwise "cycle" with it.
    """
    graph: dict[str, list[Import]] = {}
    for name, module in modules.items():
        graph[name] = [
            found
            for found in imports[name]
            if found.target in modules
            and found.target != name
            and not (module.is_package and found.target.startswith(name + "."))
        ]
    return graph


def strongly_connected(graph: dict[str, list[Import]]) -> list[list[str]]:
    """The components of more than one module (Tarjan's algorithm, iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted({i.target for i in graph[start]})))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            step = next(targets, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted({i.target for i in graph[step]}))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def cycle_through(component: list[str], graph: dict[str, list[Import]]) -> list[Import]:
    """One cycle inside ``component``, as its imports (shortest from the component's first module)."""
    members = set(component)
    start = component[0]
    paths: dict[str, list[Import]] = {start: []}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for edge in graph[node]:
                if edge.target == start:
                    return [*paths[node], edge]
                if edge.target in members and edge.target not in paths:
                    paths[edge.target] = [*paths[node], edge]
                    following.append(edge.target)
        frontier = following
    raise AssertionError(f"{component} is no cycle")  # a strongly connected component always holds one


def describe_cycle(edges: list[Import]) -> str:
    return (
        "cycle: "
        + " -> ".join(e.importer.name for e in edges)
        + f" -> {edges[0].importer.name}\n"
        + "\n".join(f"    {e.importer.name} imports {e.target} at {e.where()}" for e in edges)
    )


def core_layer(name: str) -> int | None:
    """The index in ``CORE_LAYERS`` of a core module, by its longest matching prefix (None outside the core)."""
    best: tuple[int, int] | None = None
    for position, (_title, prefixes) in enumerate(CORE_LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), position)
    return None if best is None else best[1]


def layer_offences(modules: dict[str, Module], graph: dict[str, list[Import]]) -> list[str]:
    """Each core import of a module in a higher layer (one line per statement and module reached)."""
    offences: dict[tuple[str, str], str] = {}
    for name, edges in sorted(graph.items()):
        mine = core_layer(name) if modules[name].folder == "anyformer-core" else None
        for edge in edges if mine is not None else ():
            theirs = core_layer(edge.target)
            if theirs is not None and theirs > mine:
                offences[(edge.where(), edge.target)] = (
                    f"{edge.where()}: {name} ({CORE_LAYERS[mine][0]}) imports {edge.target} "
                    f"({CORE_LAYERS[theirs][0]}, a layer above)"
                )
    return list(offences.values())


@functools.cache
def _project(folder: str) -> dict[str, Any]:
    """The ``[project]`` table of a plugin folder's pyproject.toml."""
    project = tomllib.loads((PLUGINS / folder / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert isinstance(project, dict)
    return project


def _is_library(folder: str) -> bool:
    """A plugin folder that registers no backend: a library its dependants import (anyformer-gguf-gpu)."""
    return "anyformer" not in _project(folder).get("entry-points", {})


def _depends_on(folder: str, distribution: str) -> bool:
    """Whether the folder's ``dependencies`` name ``distribution`` (whatever its version bounds or extras)."""
    names = (re.split(r"[\s<>=!~;\[]", str(item), maxsplit=1)[0] for item in _project(folder).get("dependencies", []))
    return distribution in names


def boundary_offences(modules: dict[str, Module], imports: dict[str, list[Import]]) -> list[str]:
    """Each import across a folder's boundary the rules forbid (see the module docstring)."""
    offences = set()  # one line per statement and module reached (``from x import a, b`` is one)
    for module in modules.values():
        for edge in imports[module.name]:
            problem = _boundary_problem(module, edge, modules)
            if problem:
                offences.add(f"{edge.where()}: {module.name} imports {edge.target}: {problem}")
    return sorted(offences)


def _boundary_problem(module: Module, edge: Import, modules: dict[str, Module]) -> str | None:
    target = modules.get(edge.target)
    top = edge.target.split(".")[0]
    if module.folder == "anyformer-core":
        if target is not None and target.folder != "anyformer-core":
            return "the core never imports a plugin or the kit"
        return None
    if top == "anyformer":
        if module.folder == "conformance":
            private = any(part.startswith("_") for part in edge.target.split(".")[1:])
            return "the kit imports public anyformer modules only" if private else None
        return None if edge.target == PLUGIN_API else f"a plugin imports from the core only {PLUGIN_API}"
    if target is None or target.folder in (module.folder, "anyformer-core"):
        return None
    if module.folder == "conformance":
        return "the kit imports no plugin"
    if target.folder == "conformance":
        return "a plugin's code imports no kit (its tests do)"
    if not _is_library(target.folder):
        return f"plugins never import each other ({target.folder} is a backend, not a library)"
    if not _depends_on(module.folder, _project(target.folder)["name"]):
        return f"{target.folder} is a library, but {module.folder}'s pyproject.toml does not depend on it"
    return None


@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    return find_modules(source_roots())


@pytest.fixture(scope="module")
def imports(modules: dict[str, Module]) -> dict[str, list[Import]]:
    return scan(modules)


@pytest.fixture(scope="module")
def graph(modules: dict[str, Module], imports: dict[str, list[Import]]) -> dict[str, list[Import]]:
    return import_graph(modules, imports)


# ---- the scan itself -----------------------------------------------------------------------------------


def _fake(tmp_path: Path, files: dict[str, str]) -> dict[str, Module]:
    for name, text in files.items():
        path = tmp_path / "src" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return find_modules([("fake", tmp_path / "src")])


def test_deferred_type_only_and_relative_imports_all_count(tmp_path: Path) -> None:
    modules = _fake(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg import a\n",
            "pkg/a.py": "def f():\n    from pkg.b import g\n",
            "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import c\n",
            "pkg/c.py": "from .sub.d import x\nimport numpy\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/d.py": "from .. import a\n",
        },
    )
    graph = import_graph(modules, scan(modules))
    assert {name: sorted({e.target for e in edges}) for name, edges in graph.items()} == {
        "pkg": [],  # its own submodule: the package's surface
        "pkg.a": ["pkg.b"],
        "pkg.b": ["pkg.c"],
        "pkg.c": ["pkg.sub.d"],
        "pkg.sub": [],
        "pkg.sub.d": ["pkg.a"],
    }
    (component,) = strongly_connected(graph)
    assert component == ["pkg.a", "pkg.b", "pkg.c", "pkg.sub.d"]
    message = describe_cycle(cycle_through(component, graph))
    assert message.startswith("cycle: pkg.a -> pkg.b -> pkg.c -> pkg.sub.d -> pkg.a")
    assert "pkg.a imports pkg.b at " in message and "src/pkg/a.py:2" in message.replace("\\", "/")


def test_a_graph_without_cycles_has_no_component() -> None:
    graph = {"a": [], "b": [Import(Module("b", ROOT / "b.py", "x"), "a", 1)]}
    assert strongly_connected(graph) == []


@pytest.mark.parametrize(
    ("name", "layer"),
    [
        ("anyformer.contract._request", "contract"),
        ("anyformer.store._hub", "services"),
        ("anyformer.machine._probe", "services"),
        ("anyformer.rpc._protocol", "services"),
        ("anyformer._api", "host"),
        ("anyformer", "host"),
        ("anyformer.isolation._worker", "host"),
        ("anyformer.cli._main", "cli and server"),
        ("anyformer.server._app", "cli and server"),
    ],
)
def test_each_core_module_has_the_layer_its_prefix_names(name: str, layer: str) -> None:
    found = core_layer(name)
    assert found is not None and CORE_LAYERS[found][0] == layer
    assert core_layer("anyformer_llamacpp.engine") is None


@pytest.mark.parametrize(
    ("folder", "source", "problem"),
    [
        ("anyformer-localmind", "from anyformer.plugin import Model", None),
        ("anyformer-localmind", "from anyformer import Model", "imports from the core only anyformer.plugin"),
        ("anyformer-localmind", "def f():\n    import anyformer._plugins", "only anyformer.plugin"),
        ("anyformer-localmind", "from anyformer_gguf_gpu.gpu import GPU", None),
        ("anyformer-localmind", "from anyformer_llamacpp.engine import x", "plugins never import each other"),
        ("anyformer-llamacpp", "from anyformer_gguf_gpu.gpu import GPU", "does not depend on it"),
        ("anyformer-llamacpp", "from anyformer_conformance import BackendSuite", "imports no kit"),
        ("conformance", "import anyformer\nfrom anyformer import hookspecs", None),
        ("conformance", "from anyformer._plugins import x", "public anyformer modules only"),
        ("conformance", "from anyformer_localmind.plugin import can_run", "the kit imports no plugin"),
        ("anyformer-core", "from anyformer_localmind import plugin", "the core never imports a plugin"),
    ],
)
def test_the_boundary_rules_name_what_each_folder_may_import(
    modules: dict[str, Module], folder: str, source: str, problem: str | None
) -> None:
    importer = Module("probe_module", ROOT / folder / "src" / "probe_module.py", folder)
    found = [_boundary_problem(importer, edge, modules) for edge in imports_of(importer, modules, source)]
    if problem is None:
        assert found and all(p is None for p in found), found
    else:
        assert any(p is not None and problem in p for p in found), found


# ---- the rules over every package on disk --------------------------------------------------------------


def test_every_package_folder_is_scanned(modules: dict[str, Module]) -> None:
    folders = {m.folder for m in modules.values()}
    expected = {"anyformer-core", "conformance"} | {p.parent.name for p in PLUGINS.glob("*/src")}
    assert folders == expected and {"anyformer-llamacpp", "_template", "anyformer-gguf-gpu"} <= folders
    assert {"anyformer.contract._verdict", "anyformer._api", "anyformer.cli._main"} <= set(modules)


def test_no_import_cycles(modules: dict[str, Module], graph: dict[str, list[Import]]) -> None:
    cycles = [describe_cycle(cycle_through(component, graph)) for component in strongly_connected(graph)]
    assert not cycles, "move the piece both need into a module of its own that both import:\n" + "\n".join(cycles)


def test_the_core_is_in_layers(modules: dict[str, Module], graph: dict[str, list[Import]]) -> None:
    offences = layer_offences(modules, graph)
    assert not offences, "a layer imports only its own and those below (CORE_LAYERS):\n" + "\n".join(offences)


def test_every_core_module_has_a_layer(modules: dict[str, Module]) -> None:
    assert [m for m, module in modules.items() if module.folder == "anyformer-core" and core_layer(m) is None] == []


def test_each_folder_imports_only_what_it_may(modules: dict[str, Module], imports: dict[str, list[Import]]) -> None:
    offences = boundary_offences(modules, imports)
    assert not offences, "\n".join(offences)
