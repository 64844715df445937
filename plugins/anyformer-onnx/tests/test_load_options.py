"""The ONNX backend's load options reach onnxruntime parsed by the core's schema (text as the CLI sends it)."""

from __future__ import annotations

from pathlib import Path

import pytest

import anyformer
from anyformer import AnyformerError, ErrorCode, Refusal
from anyformer_onnx.graphs import PRECISIONS
from anyformer_onnx.load_options import LOAD_OPTIONS


def test_the_precision_choices_are_the_graph_suffixes_meanings() -> None:
    choices = {o.name: o for o in LOAD_OPTIONS}["precision"].choices
    assert set(choices) == set(PRECISIONS.values())
    assert anyformer.get_plugin_manager().load_options("onnx") is LOAD_OPTIONS


def test_a_threads_option_given_as_text_reaches_the_session(text_classifier_dir: Path) -> None:
    options = {"threads": "1", "provider": "cpu", "precision": "fp32"}
    with anyformer.load(text_classifier_dir, backend="onnx", options=options) as loaded:
        session = loaded.handle.encoder.session
        assert session.get_session_options().intra_op_num_threads == 1
        assert session.get_providers() == ["CPUExecutionProvider"]


def test_a_precision_the_repo_lacks_is_a_format_refusal_an_unknown_one_bad_request(text_classifier_dir: Path) -> None:
    _, selection = anyformer.check(text_classifier_dir, backend="onnx", options={"precision": "q4"})
    (verdict,) = selection.verdicts
    assert verdict.code is Refusal.FORMAT and "no q4" in verdict.reason
    with pytest.raises(AnyformerError) as caught:
        anyformer.check(text_classifier_dir, backend="onnx", options={"precision": "fp8"})
    assert caught.value.code is ErrorCode.BAD_REQUEST and "'precision' must be one of" in caught.value.message


def test_a_file_option_is_no_onnx_option(text_classifier_dir: Path) -> None:
    with pytest.raises(AnyformerError) as caught:
        anyformer.check(text_classifier_dir, backend="onnx", options={"file": "onnx/model.onnx"})
    assert caught.value.code is ErrorCode.BAD_REQUEST and "unknown load option 'file'" in caught.value.message
