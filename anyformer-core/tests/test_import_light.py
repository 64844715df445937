"""``import anyformer`` stays light: no engine, array or Hub library is imported until it is used."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Libraries that take seconds to import or bring native runtimes; backends import them in ``load``. And
#: what a command needs only now and then: jinja2 (a chat template renders), rich, importlib.metadata
#: (the entry points come from a cache, see test_entry_point_cache.py), subprocess (a probe, a worker).
HEAVY = (
    "llama_cpp",
    "onnxruntime",
    "wgpu",
    "torch",
    "numpy",
    "gguf",
    "huggingface_hub",
    "jinja2",
    "rich",
    "importlib.metadata",
    "subprocess",
)

_PROBE = """
import json, sys
{imports}
heavy = {heavy!r}
print(json.dumps(sorted(name for name in sys.modules if name in heavy or name.split(".")[0] in heavy)))
"""


def _heavy_after(imports: str) -> list[str]:
    code = _PROBE.format(imports=imports, heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_anyformer_imports_no_heavy_library() -> None:
    assert _heavy_after("import anyformer") == []


@pytest.mark.parametrize(
    "imports",
    [
        "import anyformer.cli._main",
        "import anyformer.hookspecs",
        "import anyformer; anyformer.Model.from_dict({'repo': 'a/b', 'files': [{'name': 'm.gguf', 'size': 1}]})",
        "import anyformer; anyformer.PluginManager()",
        "import anyformer; anyformer.parse_size('4GB'); anyformer.validate_messages('hi')",
    ],
    ids=["cli", "hookspecs", "describe-json", "plugin-manager", "helpers"],
)
def test_core_entry_points_import_no_heavy_library(imports: str) -> None:
    assert _heavy_after(imports) == []


def test_the_probe_would_notice_a_heavy_import() -> None:
    """The guard itself can fail: importing a listed module is reported."""
    assert _heavy_after("import json as numpy; import sys; sys.modules['numpy'] = numpy") == ["numpy"]


def test_the_probe_would_notice_importlib_metadata() -> None:
    assert _heavy_after("import importlib.metadata") == ["importlib.metadata"]
