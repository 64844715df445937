"""When no installed backend reads a model's format, the error names the packages that do."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import anyformer
from anyformer import AnyformerError, Caps, ErrorCode, PluginManager, Refusal, Verdict, hookimpl
from anyformer._known_backends import KNOWN_BACKENDS

DOCS_TABLE = Path(__file__).parents[2] / "docs" / "backends" / "README.md"
ROOMY = Caps(ram_bytes=16 * 2**30)


class _Refuses:
    def __init__(self, name: str, code: Refusal, need: int | None = None) -> None:
        self.name, self.code, self.need = name, code, need

    @hookimpl
    def can_run(self) -> Verdict:
        return Verdict.refuse(self.name, self.code, "no", need=self.need)


def _manager(*plugins: _Refuses) -> PluginManager:
    manager = PluginManager()
    for plugin in plugins:
        manager.register(plugin, plugin.name)
    return manager


def _model(*names: str) -> dict[str, Any]:
    return {"repo": "org/m", "files": [{"name": name, "size": 100} for name in names]}


def test_the_docs_table_lists_exactly_the_known_backends() -> None:
    rows = re.findall(r"^\| `([\w-]+)` \| `(\w+)` \| ([\w, ]+) \|", DOCS_TABLE.read_text(), re.MULTILINE)
    documented = [(dist, backend, tuple(f.strip() for f in formats.split(","))) for dist, backend, formats in rows]
    assert documented == [(k.distribution, k.backend, k.formats) for k in KNOWN_BACKENDS]


@pytest.mark.parametrize(
    ("files", "plugins", "expected"),
    [
        (("m-Q4_0.gguf",), (), "gguf: pip install anyformer-llamacpp or anyformer-localmind or anyformer-diskformer"),
        (("model.onnx",), ("llamacpp",), "onnx: pip install anyformer-onnx or anyformer-kohra"),
        (("m-Q4_0.gguf",), ("llamacpp", "onnx"), "gguf: pip install anyformer-localmind or anyformer-diskformer"),
        (("model.safetensors",), ("llamacpp",), "safetensors: pip install anyformer-transformers"),
        (("model.mlmodel",), ("llamacpp",), "no known backend package reads its formats"),
    ],
    ids=["nothing-installed", "onnx-asked-of-llamacpp", "installed-ones-left-out", "safetensors", "unknown-format"],
)
def test_no_backend_for_the_format_names_the_distributions_that_read_it(
    files: tuple[str, ...], plugins: tuple[str, ...], expected: str
) -> None:
    manager = _manager(*(_Refuses(name, Refusal.FORMAT) for name in plugins))
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(_model(*files), caps=ROOMY, plugins=manager)
    assert caught.value.code is ErrorCode.NO_BACKEND
    assert expected in caught.value.message


def test_a_backend_that_reads_the_format_but_refuses_for_another_reason_gets_no_install_hint() -> None:
    manager = _manager(_Refuses("llamacpp", Refusal.MEMORY, need=10**12), _Refuses("onnx", Refusal.FORMAT))
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(_model("m-Q4_0.gguf"), caps=ROOMY, plugins=manager)
    assert caught.value.code is ErrorCode.NO_BACKEND
    assert "pip install" not in caught.value.message and "llamacpp: memory" in caught.value.message
