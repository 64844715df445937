"""Unit tests of the n-gram engine and of the plugin's own decisions (the kit covers the contract)."""

from __future__ import annotations

import inspect
import json
import threading
from collections.abc import Generator
from pathlib import Path

import pytest

import anyformer
from anyformer import AnyformerError, Caps, ErrorCode, GenerateOptions, Refusal, Request
from anyformer_template import ngram, plugin
from anyformer_template.sample import SAMPLE_TEXT, write_sample


def _greedy(model: ngram.NgramModel, prompt: str, limit: int = 200) -> str:
    out = []
    for char in model.generate(prompt):
        if char == model.end or len(out) >= limit:
            break
        out.append(char)
    return "".join(out)


# ---- training and the table -----------------------------------------------------------------------


def test_train_counts_every_context_up_to_order_minus_one() -> None:
    model = ngram.train("abab", order=3, end=".")
    assert model.table[""] == {"a": 2, "b": 2, ".": 1}
    assert model.table["a"] == {"b": 2}
    assert model.table["ab"] == {"a": 1, ".": 1}
    assert max(len(context) for context in model.table) == 2


def test_train_appends_the_end_character_once() -> None:
    assert ngram.train("hi\n", order=2).table[""] == {"h": 1, "i": 1, "\n": 1}
    assert ngram.train("hi", order=2).table[""] == {"h": 1, "i": 1, "\n": 1}


@pytest.mark.parametrize("order", [0, ngram.MAX_ORDER + 1, True, 2.5])
def test_train_rejects_a_bad_order(order: object) -> None:
    with pytest.raises(ValueError, match="order"):
        ngram.train("text", order=order)  # type: ignore[arg-type]


def test_train_rejects_an_empty_text() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        ngram.train("", order=2)


# ---- generation -----------------------------------------------------------------------------------


def test_greedy_reproduces_an_unambiguous_text() -> None:
    model = ngram.train("the end\n", order=3)
    assert _greedy(model, "th") == "e end"


def test_greedy_breaks_ties_to_the_smallest_character() -> None:
    model = ngram.train("ab\nac\n", order=2)
    assert _greedy(model, "a") == "b"


def test_generation_backs_off_to_shorter_contexts() -> None:
    model = ngram.train("xyz\n", order=4)
    # "qqy" and "qy" are unknown: the engine falls back to "y", which was followed by "z".
    assert _greedy(model, "qqy") == "z"


def test_an_order_one_model_ignores_the_prompt() -> None:
    model = ngram.train("aab\n", order=1)
    assert _greedy(model, "anything", limit=5) == _greedy(model, "", limit=5) == "aaaaa"


def test_greedy_ends_at_the_end_character() -> None:
    chars = list(ngram.train("ok\n", order=3).generate("o"))
    assert chars == ["k", "\n"]


def test_sampling_is_repeatable_with_a_seed_and_varies_across_seeds() -> None:
    model = _sample_model()
    draws = {seed: "".join(_take(model.generate("the ", temperature=1.0, seed=seed), 40)) for seed in range(6)}
    again = "".join(_take(model.generate("the ", temperature=1.0, seed=3), 40))
    assert again == draws[3]
    assert len(set(draws.values())) > 1


def test_a_tiny_temperature_samples_the_most_frequent_character_without_overflow() -> None:
    model = ngram.train("aaab\n", order=2)  # after "a": "a" twice, "b" once
    assert {next(model.generate("a", temperature=1e-6, seed=seed)) for seed in range(50)} == {"a"}


def test_the_model_keeps_no_state_between_generations() -> None:
    model = _sample_model()
    first = _greedy(model, "hello", limit=30)
    _greedy(model, "a tiny model", limit=30)
    assert _greedy(model, "hello", limit=30) == first


def _take(chars, count: int) -> list[str]:
    out = []
    for char in chars:
        out.append(char)
        if len(out) == count:
            break
    return out


def _sample_model() -> ngram.NgramModel:
    return ngram.train(SAMPLE_TEXT, order=4)


# ---- the file format ------------------------------------------------------------------------------


def test_a_saved_model_reads_back_equal(tmp_path: Path) -> None:
    path = write_sample(tmp_path)
    assert path.name == "ngram.json"
    assert ngram.read_model(path) == ngram.train(SAMPLE_TEXT, order=4)


@pytest.mark.parametrize(
    ("data", "fault"),
    [
        ([], "JSON object"),
        ({"format": "gguf", "order": 2, "table": {"": {"a": 1}}}, "format"),
        ({"format": ngram.FORMAT, "version": 9, "order": 2, "table": {"": {"a": 1}}}, "version"),
        ({"format": ngram.FORMAT, "order": "2", "table": {"": {"a": 1}}}, "order"),
        ({"format": ngram.FORMAT, "order": 2, "end": "", "table": {"": {"a": 1}}}, "end"),
        ({"format": ngram.FORMAT, "order": 2, "table": []}, "table"),
        ({"format": ngram.FORMAT, "order": 2, "table": {"abc": {"a": 1}, "": {"a": 1}}}, "longer than"),
        ({"format": ngram.FORMAT, "order": 2, "table": {"": {}}}, "non-empty"),
        ({"format": ngram.FORMAT, "order": 2, "table": {"": {"ab": 1}}}, "single character"),
        ({"format": ngram.FORMAT, "order": 2, "table": {"": {"a": 0}}}, "positive integer"),
        ({"format": ngram.FORMAT, "order": 2, "table": {"": {"a": True}}}, "positive integer"),
        ({"format": ngram.FORMAT, "order": 2, "table": {"a": {"b": 1}}}, "empty context"),
    ],
)
def test_parse_names_the_fault(data: object, fault: str) -> None:
    with pytest.raises(ngram.NgramFormatError, match=fault):
        ngram.parse(data)


def test_read_model_rejects_invalid_json_and_bad_utf8(tmp_path: Path) -> None:
    broken = tmp_path / "ngram.json"
    broken.write_text('{"format": ', encoding="utf-8")
    with pytest.raises(ngram.NgramFormatError, match="not valid JSON"):
        ngram.read_model(broken)
    broken.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ngram.NgramFormatError, match="not valid JSON"):
        ngram.read_model(broken)


def test_read_model_rejects_deep_nesting(tmp_path: Path) -> None:
    deep = tmp_path / "ngram.json"
    deep.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    with pytest.raises(ngram.NgramFormatError):
        ngram.read_model(deep)


def test_read_model_refuses_a_file_over_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ngram, "MAX_FILE_BYTES", 10)
    with pytest.raises(ngram.NgramFormatError, match="over the 10"):
        ngram.read_model(write_sample(tmp_path))


# ---- the plugin's decisions -----------------------------------------------------------------------


def _manager() -> anyformer.PluginManager:
    manager = anyformer.PluginManager()
    manager.register(plugin, "template")
    return manager


def test_can_run_accepts_the_sample_with_its_memory_estimate(tmp_path: Path) -> None:
    write_sample(tmp_path)
    model = anyformer.describe(tmp_path)
    verdict = plugin.can_run(model, Caps(ram_bytes=2**30), Request())
    size = model.file("ngram.json").size
    assert verdict.ok and verdict.estimate.ram_bytes == plugin.RAM_OVERHEAD + plugin.RAM_PER_FILE_BYTE * size
    assert verdict.estimate.disk_bytes == size


def test_the_memory_refusal_needs_more_than_is_available() -> None:
    model = anyformer.Model(repo="x/y", files=(anyformer.ModelFile("ngram.json", 1000),))
    verdict = plugin.can_run(model, Caps(ram_bytes=1000), Request())
    assert verdict.code is Refusal.MEMORY
    assert verdict.need == plugin.RAM_OVERHEAD + 8000 > 1000


def test_load_of_malformed_json_is_bad_model(tmp_path: Path) -> None:
    (tmp_path / "ngram.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(tmp_path, backend="template", plugins=_manager(), caps=Caps(ram_bytes=2**30))
    assert caught.value.code is ErrorCode.BAD_MODEL
    assert "ngram.json" in caught.value.message


def test_load_of_a_valid_json_that_is_not_a_model_is_bad_model(tmp_path: Path) -> None:
    (tmp_path / "ngram.json").write_text(json.dumps({"format": "something-else"}), encoding="utf-8")
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(tmp_path, backend="template", plugins=_manager(), caps=Caps(ram_bytes=2**30))
    assert caught.value.code is ErrorCode.BAD_MODEL


def test_a_what_if_description_cannot_be_loaded() -> None:
    description = {"repo": "org/ngram", "files": [{"name": "ngram.json", "size": 100}]}
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(description, backend="template", plugins=_manager(), caps=Caps(ram_bytes=2**30))
    assert caught.value.code is ErrorCode.MODEL_NOT_FOUND


def test_generate_stops_with_stop_at_the_end_character(tmp_path: Path) -> None:
    write_sample(tmp_path, text="ok\n", order=3)
    with anyformer.load(tmp_path, backend="template", plugins=_manager(), caps=Caps(ram_bytes=2**30)) as loaded:
        last = loaded.complete("o", max_new_tokens=50)
    assert (last.text, last.finish_reason, last.tokens) == ("k", "stop", 2)


def test_the_handle_checks_cancel_before_each_token(tmp_path: Path) -> None:
    write_sample(tmp_path)
    handle = plugin.load(anyformer.describe(tmp_path), Request(), lambda event: None)
    cancel = threading.Event()
    stream = handle.generate([{"role": "user", "content": "the"}], GenerateOptions(max_new_tokens=100, cancel=cancel))
    first = next(stream)
    cancel.set()
    last = next(stream)
    assert (first.tokens, first.finish_reason) == (1, None)
    assert (last.tokens, last.delta, last.finish_reason) == (1, "", "cancelled")


def test_closing_the_stream_early_closes_the_engine_s_generator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_sample(tmp_path)
    handle = plugin.load(anyformer.describe(tmp_path), Request(), lambda event: None)
    started: list[Generator[str, None, None]] = []
    real_generate = ngram.NgramModel.generate

    def recorded(
        self: ngram.NgramModel, prompt: str, *, temperature: float = 0.0, seed: int | None = None
    ) -> Generator[str, None, None]:
        started.append(real_generate(self, prompt, temperature=temperature, seed=seed))
        return started[-1]

    monkeypatch.setattr(ngram.NgramModel, "generate", recorded)
    stream = handle.generate([{"role": "user", "content": "the"}], GenerateOptions(max_new_tokens=100))
    assert next(stream).tokens == 1
    assert inspect.getgeneratorstate(started[0]) == inspect.GEN_SUSPENDED  # mid-answer
    stream.close()  # type: ignore[attr-defined]
    assert inspect.getgeneratorstate(started[0]) == inspect.GEN_CLOSED  # the stream's finally closed it


def test_store_list_lists_models_under_anyformer_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYFORMER_HOME", str(tmp_path))
    assert plugin.store_list() == []
    path = write_sample(tmp_path / "template" / "org" / "tiny")
    (tmp_path / "template" / "ngram.json").write_text("{}", encoding="utf-8")  # not in a model folder: ignored
    [entry] = plugin.store_list()
    assert (entry.backend, entry.repo, entry.revision, entry.path, entry.bytes) == (
        "template",
        "org/tiny",
        None,
        str(path),
        path.stat().st_size,
    )


def test_can_run_refuses_store_only_when_a_download_has_nowhere_to_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    hub = anyformer.Model.from_dict(
        {"repo": "org/ngram", "source": "hub", "revision": "main", "files": [{"name": "ngram.json", "size": 20_000}]}
    )
    roomy = Caps(ram_bytes=10**9, store=True, disk_free_bytes=10**9)
    assert plugin.can_run(hub, roomy, Request()).ok
    full = plugin.can_run(hub, roomy.replace(disk_free_bytes=10_000), Request())
    assert full.code is Refusal.STORE and "20 KB" in full.reason and "10 KB free" in full.reason
    assert plugin.can_run(hub, roomy.replace(store=False), Request()).code is Refusal.STORE
    commit = "b" * 40
    snapshot = tmp_path / "hub" / "models--org--ngram" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "ngram.json").write_bytes(b"{}".ljust(20_000))
    (tmp_path / "hub" / "models--org--ngram" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--ngram" / "refs" / "main").write_text(commit)
    assert plugin.can_run(hub, roomy.replace(store=False, disk_free_bytes=0), Request()).ok, "cached: no download"
