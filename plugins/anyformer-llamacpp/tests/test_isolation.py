"""llama.cpp in an isolated worker: the real engine, real aborts, and a caller that lives on.

A tiny llama GGUF whose vocabulary holds a token twice passes the core's header validator, and
llama.cpp 0.3.36 aborts the whole process on it (``GGML_ASSERT(id_to_token.size() ==
token_to_id.size())``). The backend now refuses it as ``BAD_MODEL``; a test backend that hands the
file to ``llama_cpp.Llama`` directly, with no check, shows what isolation does when the engine dies.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import gguf
import pytest
from tiny_gguf import write_tiny_llama

import anyformer
from anyformer import AnyformerError, ErrorCode
from anyformer.files._gguf_header import read_gguf_header

_RAW_BACKEND = """
from anyformer import Estimate, Rank, Verdict, hookimpl
from anyformer.plugin import BackendModel


class Handle(BackendModel):
    backend = "raw-llamacpp"
    task = "text-generation"

    def __init__(self, llama):
        self.llama = llama

    def dispose(self):
        self.llama.close()


@hookimpl
def can_run(model):
    return Verdict.accept("raw-llamacpp", Estimate(ram_bytes=10**6, rank=Rank.FALLBACK))


@hookimpl
def load(model):
    from llama_cpp import Llama  # no header check, no vocabulary check: the engine sees the file as it is

    return Handle(Llama(model_path=model.files[0].path, n_ctx=256, verbose=False))
"""


def duplicate_a_token(path: Path) -> Path:
    """Make the vocabulary's sixth token a copy of the fifth (both one byte), in place."""
    reader = gguf.GGUFReader(str(path), "r+")
    tokens = reader.fields["tokenizer.ggml.tokens"]
    tokens.parts[tokens.data[5]][...] = tokens.parts[tokens.data[4]]
    del reader
    return path


@pytest.fixture(scope="module")
def duplicated_vocabulary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return duplicate_a_token(write_tiny_llama(tmp_path_factory.mktemp("dup") / "dup-vocab-F32.gguf"))


@pytest.fixture
def raw_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A distribution on sys.path whose backend ``raw-llamacpp`` opens any GGUF with llama.cpp unchecked."""
    site = tmp_path / "site"
    info = site / "aftest_raw_llamacpp-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: aftest-raw-llamacpp\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[anyformer]\nraw-llamacpp = aftest_raw_llamacpp\n")
    (site / "aftest_raw_llamacpp.py").write_text(textwrap.dedent(_RAW_BACKEND))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("ANYFORMER_PLUGINS", "raw-llamacpp,llamacpp")
    importlib.invalidate_caches()
    from anyformer._plugins import reset_plugin_manager

    reset_plugin_manager()
    yield "raw-llamacpp"
    reset_plugin_manager()
    sys.modules.pop("aftest_raw_llamacpp", None)


def test_the_duplicated_vocabulary_passes_the_core_validator(duplicated_vocabulary: Path) -> None:
    header = read_gguf_header(duplicated_vocabulary)
    tokens = header.get("tokenizer.ggml.tokens")
    assert tokens[4] == tokens[5]


@pytest.mark.safety("G17")
@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "worker"])
def test_the_backend_refuses_a_vocabulary_that_makes_llamacpp_abort(duplicated_vocabulary: Path, isolate: bool) -> None:
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(duplicated_vocabulary, backend="llamacpp", isolate=isolate)
    assert caught.value.code is ErrorCode.BAD_MODEL and "repeats token 4" in caught.value.message


@pytest.mark.safety("G17", "R6")
def test_a_real_llamacpp_abort_ends_only_the_worker(
    duplicated_vocabulary: Path, raw_backend: str, tiny_gguf: Path
) -> None:
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(duplicated_vocabulary, backend=raw_backend, isolate=True)
    error = caught.value
    assert error.code is ErrorCode.BACKEND_CRASHED, error
    assert "killed by SIGABRT while loading" in error.message
    # llama-cpp-python points fd 2 at /dev/null while loading, so ggml's own line is lost; the
    # worker's faulthandler writes to a descriptor of its own and names where Python was.
    assert "Fatal Python error: Aborted" in error.message and "llama_cpp" in error.message
    with anyformer.load(tiny_gguf, backend="llamacpp", isolate=True) as loaded:  # the caller lives on
        assert loaded.complete("hi", max_new_tokens=4).tokens >= 1


@pytest.mark.safety("R1", "R6")
def test_llamacpp_in_a_worker_streams_what_it_streams_in_process(tiny_gguf: Path, tiny: anyformer.Loaded) -> None:
    messages = [{"role": "user", "content": "hello there"}]
    with anyformer.load(tiny_gguf, backend="llamacpp", isolate=True) as isolated:
        assert isolated.isolated
        for options in ({"max_new_tokens": 12}, {"max_new_tokens": 30, "stop": "e"}):
            assert list(isolated.generate(messages, **options)) == list(tiny.generate(messages, **options))
        stream = isolated.generate(messages, max_new_tokens=200)
        next(stream)
        stream.close()
        assert isolated.complete(messages, max_new_tokens=12) == tiny.complete(messages, max_new_tokens=12)


_MRO_TEMPLATE = (
    "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{% if c.__name__ == 'Popen' %}"
    "{{ c(['touch', marker]) }}{% endif %}{% endfor %}{{ messages[0].content }}"
)


@pytest.mark.safety("G16")
@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "worker"])
def test_a_chat_template_reaching_for_the_mro_is_refused_and_runs_nothing(tmp_path: Path, isolate: bool) -> None:
    marker = tmp_path / "ran"
    template = _MRO_TEMPLATE.replace("marker", repr(str(marker)))
    path = write_tiny_llama(tmp_path / "mro-template-F32.gguf", chat_template=template)
    with anyformer.load(path, backend="llamacpp", isolate=isolate) as loaded:
        with pytest.raises(AnyformerError) as caught:
            loaded.complete("hi", max_new_tokens=2)
        assert caught.value.code is ErrorCode.BAD_MODEL and "unsafe" in caught.value.message
    assert not marker.exists(), "the template ran a command"
