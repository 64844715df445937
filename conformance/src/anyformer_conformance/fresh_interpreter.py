"""Probes the kit runs in a fresh Python interpreter, where nothing is imported or cached yet.

Two things only show in a new process: what importing the plugin module costs (the engines it
imports, what it prints), and the first ``can_run`` of a process (a lazy import or a cache
filled on the first call). Every ``anyformer check`` is such a process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

__all__ = ["FirstCanRun", "ImportProbe", "first_can_run", "import_plugin_module"]

#: How long a probe may run before the kit gives up on it, in seconds.
PROBE_TIMEOUT_S = 120

# The result is the last line of stdout; anything printed before it came from the import.
_IMPORT_SCRIPT = """
import importlib, json, sys
import anyformer
before = set(sys.modules)
importlib.import_module(sys.argv[1])
heavy = set(json.loads(sys.argv[2]))
sys.stdout.flush()
print("\\n" + json.dumps(sorted({name.partition(".")[0] for name in set(sys.modules) - before} & heavy)))
"""

_FIRST_CAN_RUN_SCRIPT = """
import importlib, inspect, json, pickle, sys, time
from anyformer_conformance.io_spy import IOSpy
module, _, attribute = sys.argv[1].partition(":")
plugin = importlib.import_module(module)
for name in filter(None, attribute.split(".")):
    plugin = getattr(plugin, name)
with open(sys.argv[2], "rb") as handle:
    arguments = pickle.load(handle)
can_run = getattr(plugin, "can_run")
wanted = inspect.signature(can_run).parameters
spy = IOSpy()
with spy.watching():
    started = time.monotonic()
    try:
        verdict = can_run(**{k: v for k, v in arguments.items() if k in wanted})
        error = None
    except BaseException as exc:
        verdict, error = None, f"{type(exc).__name__}: {exc}"
    seconds = time.monotonic() - started
print(json.dumps({"seconds": seconds, "opened": spy.opened, "connections": spy.connections,
                  "error": error, "verdict": repr(verdict)}))
"""


def _environment() -> dict[str, str]:
    """The test process's environment, with its import path (a checkout's src folders) and the Hub offline."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "HF_HUB_OFFLINE": "1"}


@dataclasses.dataclass(frozen=True)
class ImportProbe:
    """What importing a plugin module in a fresh interpreter did."""

    #: The heavy modules the import added.
    heavy: list[str]
    #: What the import wrote to stdout (``anyformer check --json`` would no longer be JSON).
    printed: str
    #: Why the probe gave no answer (a failed or hung import), or None.
    failure: str | None = None


def import_plugin_module(module: str, heavy_modules: Sequence[str]) -> ImportProbe:
    """Import ``module`` in a new interpreter and report the heavy modules it imported and what it printed."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _IMPORT_SCRIPT, module, json.dumps(list(heavy_modules))],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            env=_environment(),
        )
    except subprocess.TimeoutExpired:
        return ImportProbe([], "", f"the import took over {PROBE_TIMEOUT_S} s, expected a fraction of a second")
    if done.returncode != 0:
        return ImportProbe([], "", f"the import failed: {done.stderr.strip()[-600:]}")
    # The script puts a newline before its result, so whatever comes before that newline was printed.
    printed, _, result = done.stdout.rstrip("\n").rpartition("\n")
    return ImportProbe(json.loads(result), printed)


@dataclasses.dataclass(frozen=True)
class FirstCanRun:
    """The first ``can_run`` of a fresh interpreter: how long it took, what it opened and tried to reach."""

    seconds: float
    opened: list[str]
    connections: list[str]
    #: What the call raised, or None.
    error: str | None
    verdict: str
    #: Why the probe gave no answer, or None.
    failure: str | None = None


def first_can_run(plugin: str, arguments: dict[str, Any]) -> FirstCanRun:
    """Call ``can_run`` of ``plugin`` (``module`` or ``module:attribute``) once, first thing in a new interpreter.

    ``arguments`` (``model``, ``caps``, ``request``) cross to it pickled. The plugin module's
    import is not timed: only the call.
    """
    with tempfile.TemporaryDirectory(prefix="anyformer-conformance-") as folder:
        path = os.path.join(folder, "arguments.pickle")
        with open(path, "wb") as handle:
            pickle.dump(arguments, handle)
        try:
            done = subprocess.run(
                [sys.executable, "-c", _FIRST_CAN_RUN_SCRIPT, plugin, path],
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
                env=_environment(),
            )
        except subprocess.TimeoutExpired:
            return FirstCanRun(PROBE_TIMEOUT_S, [], [], None, "", f"no answer within {PROBE_TIMEOUT_S} s")
    if done.returncode != 0:
        return FirstCanRun(0.0, [], [], None, "", f"the probe failed: {done.stderr.strip()[-600:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return FirstCanRun(result["seconds"], result["opened"], result["connections"], result["error"], result["verdict"])
