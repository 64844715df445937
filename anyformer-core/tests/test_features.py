"""``Features``: the one record a handle declares, read once after load and sent across the worker pipe."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from anyformer import AnyformerError, ErrorCode
from anyformer._backend import features_of
from anyformer.plugin import BackendModel, Features


class _Chat(BackendModel):
    backend, task = "chat", "text-generation"

    def dispose(self) -> None:
        pass


class _Embedder(_Chat):
    task = "feature-extraction"
    features = Features(run_progress=True)

    def run(self, input: Any, **options: Any) -> Any:
        return input


def test_a_handle_that_declares_nothing_is_a_plain_chat_model_serving_one_stream() -> None:
    features = features_of(_Chat())
    assert features.parallel == 1 and features.honours == frozenset()
    assert not (features.raw_text or features.prompt_logprobs or features.audio_input or features.run_progress)
    assert not features.run


def test_the_record_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Features().parallel = 2  # type: ignore[misc]


def test_the_core_sets_run_from_whether_the_class_overrides_it() -> None:
    assert features_of(_Embedder()).run is True
    assert features_of(_Chat()).run is False


def test_a_round_trip_through_the_wire_form_keeps_every_field() -> None:
    declared = Features(raw_text=True, prompt_logprobs=True, parallel=3, honours=frozenset({"min_p", "tools"}))
    wire = declared.to_dict()
    assert wire["honours"] == ["min_p", "tools"]
    assert Features.from_dict(wire) == declared


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        (Features(parallel=0), "features.parallel must be a positive int"),
        (Features(parallel=True), "features.parallel must be a positive int"),
        (Features(raw_text=1), "features.raw_text must be True or False"),  # type: ignore[arg-type]
        (Features(honours=frozenset({"temprature"})), "features.honours names 'temprature'"),
        (Features(prompt_logprobs=True), "prompt_logprobs needs raw_text"),
        (Features(run_progress=True), "run_progress needs a handle that overrides run()"),
    ],
)
def test_a_wrong_declaration_is_a_plugin_error_naming_the_backend(declared: Features, message: str) -> None:
    handle = _Chat()
    handle.features = declared
    with pytest.raises(AnyformerError, match=re.escape(message)) as caught:
        features_of(handle)
    assert caught.value.code is ErrorCode.PLUGIN_ERROR and caught.value.message.startswith("chat: ")


def test_features_that_is_not_a_record_is_a_plugin_error() -> None:
    handle = _Chat()
    handle.features = {"raw_text": True}  # type: ignore[assignment]
    with pytest.raises(AnyformerError, match=re.escape("not an anyformer.plugin.Features")) as caught:
        features_of(handle)
    assert caught.value.code is ErrorCode.PLUGIN_ERROR


@pytest.mark.parametrize("wire", [None, [], {"raw_text": True, "speed": 3}, {"honours": "top_p"}, {"parallel": "2"}])
def test_a_malformed_wire_form_is_refused(wire: Any) -> None:
    with pytest.raises(AnyformerError) as caught:
        Features.from_dict(wire)
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_a_handle_without_dispose_cannot_be_made() -> None:
    class NoDispose(BackendModel):
        backend, task = "x", "text-generation"

    with pytest.raises(TypeError, match="dispose"):
        NoDispose()  # type: ignore[abstract]
