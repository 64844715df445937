"""Choosing a backend stays light: the hooks module imports neither llama_cpp nor numpy.

Every ``anyformer`` command imports each plugin's hooks to ask ``can_run``; with isolation (the CLI's
default) the model loads in another process, so an engine or array library imported here is paid
for nothing, before the first token.
"""

from __future__ import annotations

import json
import subprocess
import sys

#: What ``load`` imports (llama_cpp with numpy and jinja2), never ``can_run``.
HEAVY = ("llama_cpp", "numpy", "jinja2")

_PROBE = """
import json, sys
{imports}
print(json.dumps(sorted(name for name in {heavy!r} if name in sys.modules)))
"""


def _heavy_after(imports: str) -> list[str]:
    code = _PROBE.format(imports=imports, heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_hooks_module_imports_no_engine_or_array_library() -> None:
    assert _heavy_after("import anyformer_llamacpp.plugin") == []


def test_the_engine_module_does_import_them() -> None:
    """The probe itself can fail: the module ``load`` imports is reported."""
    assert _heavy_after("import anyformer_llamacpp.engine") == ["jinja2", "llama_cpp", "numpy"]
