"""Load options: the typed schema a backend declares, and the core's one parse of ``Request.options``.

Read as the spec of docs/contract.md, "Load options": the yes/no spellings, defaults, unknown and
ill-typed keys (``BAD_REQUEST`` before any backend is asked or any worker starts), the ``option``
refusal of a backend that lacks a key another one declares, and the typed values a hook receives.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest

import anyformer
from anyformer import AnyformerError, Caps, ErrorCode, PluginManager, Refusal, Request, Verdict, hookimpl
from anyformer.plugin import FILE_OPTION, NO_LOAD_OPTIONS, BackendModel, LoadOption, LoadOptions, parse_yes_no

DOCS = Path(__file__).resolve().parents[2] / "docs" / "backends"
CAPS = Caps(ram_bytes=16 * 2**30)


# ---- the schema -------------------------------------------------------------------------------------


@pytest.mark.parametrize("word", [True, 1, "true", "TRUE", "yes", "Yes", "on", "1", " yes "])
def test_every_spelling_of_yes_is_true(word: object) -> None:
    assert parse_yes_no(word) is True


@pytest.mark.parametrize("word", [False, 0, "false", "False", "no", "NO", "off", "0", " off "])
def test_every_spelling_of_no_is_false(word: object) -> None:
    assert parse_yes_no(word) is False


@pytest.mark.parametrize("word", ["maybe", "", 2, -1, 0.5, None, [], "tru"])
def test_anything_else_is_bad_request_naming_what(word: object) -> None:
    with pytest.raises(AnyformerError) as caught:
        parse_yes_no(word, "load option 'x'")
    assert caught.value.code is ErrorCode.BAD_REQUEST and "load option 'x' must be true or false" in str(caught.value)


SCHEMA = LoadOptions(
    LoadOption("device", "enum", "auto", "where", choices=("auto", "cpu", "gpu")),
    LoadOption("parallel", "int", 1, "streams", minimum=1, maximum=64, words=("auto",)),
    LoadOption("fast", "bool", True, "kernels"),
    LoadOption("pool", "size", None, "bytes", minimum=1),
    LoadOption("scale", "float", 1.0, "factor", minimum=0.0),
    LoadOption("prime", "str", None, "a prompt"),
)


def test_parse_fills_every_default_and_types_text_values() -> None:
    defaults = {"device": "auto", "parallel": 1, "fast": True, "pool": None, "scale": 1.0, "prime": None}
    assert SCHEMA.parse({}) == defaults
    parsed = SCHEMA.parse({"parallel": "8", "fast": "off", "pool": "2GB", "scale": "0.5", "prime": "Hi"})
    assert parsed == {"device": "auto", "parallel": 8, "fast": False, "pool": 2 * 10**9, "scale": 0.5, "prime": "Hi"}
    assert SCHEMA.parse({"parallel": "auto", "device": "gpu", "pool": 4096})["parallel"] == "auto"
    assert SCHEMA.value({"parallel": None}, "parallel") == 1, "None reads as absent"


def test_parse_is_idempotent_so_a_hook_reads_the_core_s_values_again() -> None:
    once = SCHEMA.parse({"parallel": "8", "fast": "yes", "pool": "1MiB"})
    assert SCHEMA.parse(once) == once


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"parallel": 0}, "load option 'parallel' must be at least 1, got 0"),
        ({"parallel": 65}, "load option 'parallel' must be at most 64, got 65"),
        ({"parallel": True}, "load option 'parallel' must be a whole number"),
        ({"parallel": "four"}, "load option 'parallel' must be a whole number"),
        ({"device": "tpu"}, "load option 'device' must be one of auto, cpu, gpu, got 'tpu'"),
        ({"fast": "maybe"}, "load option 'fast' must be true or false"),
        ({"pool": "lots"}, "load option 'pool': not a size"),
        ({"pool": 0}, "load option 'pool' must be at least 1"),
        ({"scale": "nan"}, "load option 'scale' must be a finite number"),
        ({"prime": 3}, "load option 'prime' must be a string"),
        ({"colour": "red"}, "unknown load option 'colour'; the options: device (auto|cpu|gpu), parallel (int 1..64"),
    ],
)
def test_an_ill_typed_or_unknown_value_is_bad_request_naming_it(given: dict[str, Any], message: str) -> None:
    with pytest.raises(AnyformerError) as caught:
        SCHEMA.parse(given)
    assert caught.value.code is ErrorCode.BAD_REQUEST and message in caught.value.message


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: LoadOption("bad name", "int"), "identifier"),
        (lambda: LoadOption("x", "list"), "kind must be one of"),
        (lambda: LoadOption("x", "enum"), "an enum needs them"),
        (lambda: LoadOption("x", "int", "three"), "its default is not a valid value"),
        (lambda: LoadOptions(LoadOption("x", "int"), LoadOption("x", "bool")), "declared twice: x"),
    ],
)
def test_a_schema_that_cannot_be_parsed_is_refused_when_declared(build: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


# ---- the core's parse: plugins registered in process --------------------------------------------------


class _Backend:
    """A plugin that records the options its hooks were given and accepts every model."""

    def __init__(self, name: str, schema: LoadOptions | None) -> None:
        self.name = name
        if schema is not None:
            self.LOAD_OPTIONS = schema
        self.seen: list[dict[str, Any]] = []

    @hookimpl
    def can_run(self, request: Request) -> Verdict:
        self.seen.append(dict(request.options))
        return Verdict.accept(self.name)

    @hookimpl
    def load(self, request: Request) -> Any:
        self.seen.append(dict(request.options))
        return _Handle(self.name)


class _Handle(BackendModel):
    task = "text-generation"

    def __init__(self, backend: str) -> None:
        self.backend = backend

    def dispose(self) -> None:
        """Nothing to free."""


def _manager(*backends: _Backend) -> PluginManager:
    manager = PluginManager()
    for backend in backends:
        manager.register(backend, backend.name)
    return manager


def _model() -> anyformer.Model:
    return anyformer.Model.from_dict({"repo": "org/m", "files": [{"name": "m-Q4_0.gguf", "size": 10**8}]})


def _verdicts(manager: PluginManager, options: dict[str, Any], only: str | None = None) -> dict[str, Verdict]:
    return {v.backend: v for v in manager.can_run(_model(), CAPS, Request(options=options), only=only)}


def test_a_key_no_backend_declares_is_bad_request_listing_each_backend_s_options_and_none_is_asked() -> None:
    disk, llama = _Backend("disk", SCHEMA), _Backend("llama", LoadOptions(FILE_OPTION))
    with pytest.raises(AnyformerError) as caught:
        _verdicts(_manager(disk, llama), {"colour": "red", "device": "cpu"})
    assert caught.value.code is ErrorCode.BAD_REQUEST
    assert "unknown load option 'colour'" in caught.value.message
    assert "disk: device (auto|cpu|gpu)" in caught.value.message and "llama: file (str)" in caught.value.message
    assert disk.seen == [] and llama.seen == []


def test_with_one_backend_named_its_options_are_the_ones_listed() -> None:
    disk, llama = _Backend("disk", SCHEMA), _Backend("llama", LoadOptions(FILE_OPTION))
    with pytest.raises(AnyformerError) as caught:
        _verdicts(_manager(disk, llama), {"device": "cpu"}, only="llama")
    assert "unknown load option 'device'; the options backends take: llama: file (str)" in caught.value.message
    assert "disk" not in caught.value.message


def test_a_value_every_declaring_backend_refuses_is_bad_request_naming_the_option() -> None:
    disk = _Backend("disk", SCHEMA)
    with pytest.raises(AnyformerError) as caught:
        _verdicts(_manager(disk, _Backend("other", None)), {"fast": "perhaps"})
    assert caught.value.code is ErrorCode.BAD_REQUEST
    assert "load option 'fast' must be true or false" in caught.value.message and "(disk)" in caught.value.message
    assert disk.seen == []


def test_a_backend_lacking_a_key_another_declares_is_refused_with_option_and_not_asked() -> None:
    disk, plain = _Backend("disk", SCHEMA), _Backend("plain", None)
    verdicts = _verdicts(_manager(disk, plain), {"device": "cpu"})
    assert verdicts["disk"].ok and disk.seen[0]["device"] == "cpu"
    assert verdicts["plain"].code is Refusal.OPTION and plain.seen == []
    assert verdicts["plain"].reason == "takes no load option 'device' (its options: none)"


def test_a_value_only_some_declaring_backends_refuse_refuses_those_with_option() -> None:
    wide = _Backend("wide", LoadOptions(LoadOption("threads", "int", None, minimum=0)))
    narrow = _Backend("narrow", LoadOptions(LoadOption("threads", "int", None, minimum=1)))
    verdicts = _verdicts(_manager(wide, narrow), {"threads": 0})
    assert verdicts["wide"].ok and wide.seen == [{"threads": 0}]
    assert verdicts["narrow"].code is Refusal.OPTION and "must be at least 1" in verdicts["narrow"].reason


def test_each_backend_is_asked_with_its_own_options_typed_and_defaults_filled() -> None:
    fast = LoadOption("fast", "bool", True, "kernels")
    disk, llama = _Backend("disk", SCHEMA), _Backend("llama", LoadOptions(FILE_OPTION, fast))
    _verdicts(_manager(disk, llama), {"fast": "no"})
    assert disk.seen == [{**SCHEMA.parse({}), "fast": False}]
    assert llama.seen == [{"file": None, "fast": False}]


def test_parallel_changes_no_output_so_a_backend_without_it_is_asked_without_it() -> None:
    batching = _Backend("batching", LoadOptions(LoadOption("parallel", "int", 1, minimum=1, words=("auto",))))
    single = _Backend("single", None)
    verdicts = _verdicts(_manager(batching, single), {"parallel": "auto"})
    assert verdicts["batching"].ok and batching.seen == [{"parallel": "auto"}]
    assert verdicts["single"].ok and single.seen == [{}]


def test_load_parses_the_chosen_backend_s_options_before_its_hook_runs() -> None:
    disk = _Backend("disk", SCHEMA)
    manager = _manager(disk)
    manager.load("disk", _model(), Request(options={"pool": "1GB", "parallel": "3"}), lambda event: None)
    assert disk.seen[-1] == {**SCHEMA.parse({}), "pool": 10**9, "parallel": 3}
    with pytest.raises(AnyformerError) as caught:
        manager.load("disk", _model(), Request(options={"pool": "much"}), lambda event: None)
    assert caught.value.code is ErrorCode.BAD_REQUEST and "'pool'" in caught.value.message


def test_anyformer_load_refuses_a_bad_option_before_any_worker_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    import anyformer._api as api

    started: list[bool] = []
    monkeypatch.setattr(api, "_start_worker", lambda: started.append(True))
    manager = _manager(_Backend("disk", SCHEMA))
    with pytest.raises(AnyformerError) as caught:
        anyformer.load({"repo": "org/m", "files": []}, options={"device": "tpu"}, plugins=manager, isolate=True)
    assert caught.value.code is ErrorCode.BAD_REQUEST and "'device'" in caught.value.message
    assert started == []


def test_load_options_that_are_not_a_load_options_make_the_plugin_invalid() -> None:
    broken = _Backend("broken", None)
    broken.LOAD_OPTIONS = {"device": "enum"}  # type: ignore[assignment]
    manager = _manager(broken)
    (info,) = manager.plugins()
    assert not info.ok and "LOAD_OPTIONS is a dict, not an anyformer.plugin.LoadOptions" in (info.error or "")
    assert manager.backends() == []


def test_a_plugin_without_load_options_takes_none() -> None:
    manager = _manager(_Backend("plain", None))
    assert manager.load_options("plain") is NO_LOAD_OPTIONS and len(NO_LOAD_OPTIONS) == 0


# ---- the CLI -----------------------------------------------------------------------------------------


def test_the_cli_s_option_flags_become_text_options_the_core_parses() -> None:
    from anyformer.cli._common import file_option

    args = argparse.Namespace(option=["threads=2", "flash_attention=no", "prime=a=b"], file="m-Q8_0.gguf")
    assert file_option(args) == {"threads": "2", "flash_attention": "no", "prime": "a=b", "file": "m-Q8_0.gguf"}
    assert file_option(argparse.Namespace(option=[], file=None)) is None
    for bad in (["threads"], ["=2"], ["threads=1", "threads=2"]):
        with pytest.raises(AnyformerError) as caught:
            file_option(argparse.Namespace(option=bad, file=None))
        assert caught.value.code is ErrorCode.BAD_REQUEST


# ---- the docs ----------------------------------------------------------------------------------------

_INSTALLED = [name for name in anyformer.get_plugin_manager().backends() if (DOCS / f"{name}.md").is_file()]


@pytest.mark.skipif(not _INSTALLED, reason="no backend with a docs/backends page is installed (nox -s layouts)")
@pytest.mark.parametrize("backend", _INSTALLED)
def test_each_backend_page_tables_exactly_the_options_it_declares(backend: str) -> None:
    text = (DOCS / f"{backend}.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- load options: .*? -->\n(.*?)\n<!-- end of load options -->", text, re.S)
    assert found, f"docs/backends/{backend}.md has no load-options table (python scripts/load_options_docs.py)"
    schema = anyformer.get_plugin_manager().load_options(backend)
    assert found.group(1) == schema.markdown(), "out of date: run python scripts/load_options_docs.py"
    for option in schema:
        assert f"| `{option.name}` |" in found.group(1)


def test_check_refuses_a_bad_option_before_it_describes_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    import anyformer._describe as describing

    described: list[object] = []
    monkeypatch.setattr(describing, "describe", lambda model: described.append(model))
    with pytest.raises(AnyformerError) as caught:
        anyformer.check("org/m", options={"colour": "red"}, plugins=_manager(_Backend("disk", SCHEMA)))
    assert caught.value.code is ErrorCode.BAD_REQUEST and described == []


def test_anyformer_plugins_lists_each_backend_s_load_options(run_cli: Any) -> None:
    pytest.importorskip("anyformer_llamacpp")
    env = {"ANYFORMER_PLUGINS": "llamacpp", "COLUMNS": "300"}
    listed = {entry["name"]: entry for entry in run_cli("plugins", "--json", env=env).json()}
    options = {option["name"]: option for option in listed["llamacpp"]["load_options"]}
    assert options["flash_attention"] == {
        "name": "flash_attention",
        "type": "bool",
        "default": True,
        "help": "llama.cpp's fused attention kernels",
    }
    assert options["parallel"]["type"] == "int 1..64 or 'auto'"
    shown = run_cli("plugins", env=env)
    assert shown.returncode == 0 and "load options (--option KEY=VALUE)" in shown.stdout
    assert "special_in_content" in shown.stdout
