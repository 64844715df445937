"""Chat on exported decoders: greedy replies equal torch's on the same weights, token for token.

torch's answers were recorded by the fixtures before each export (onnx_exports.py); here the same
prompts go through the backend: the prompt ids its chat template renders, the ids its KV loop picks,
and the text the public API streams.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import anyformer
from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_onnx.chat.handle import OnnxChatModel
from anyformer_onnx.chat.sampling import Sampler

pytestmark = pytest.mark.slow


def _open(folder: Path) -> Iterator[anyformer.Loaded]:
    with anyformer.load(str(folder), backend="onnx") as loaded:
        yield loaded


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir: Path) -> Iterator[anyformer.Loaded]:
    yield from _open(tiny_llama_dir)


@pytest.fixture(scope="module")
def smol(smollm2_dir: Path) -> Iterator[anyformer.Loaded]:
    yield from _open(smollm2_dir)


def _check_replies(loaded: anyformer.Loaded, replies: list[dict[str, Any]]) -> None:
    handle = loaded.handle
    assert isinstance(handle, OnnxChatModel)
    eos = handle.text.eos_ids
    for reply in replies:
        messages = reply["messages"]
        assert handle.text.prompt_ids(messages) == reply["prompt_ids"], "chat template or tokenizer differ"
        ids = list(
            handle.loop.tokens(
                reply["prompt_ids"], Sampler(0.0, 0, 1.0, None), limit=len(reply["reply_ids"]), stop_ids=eos
            )
        )
        assert ids == reply["reply_ids"], f"greedy ids differ from torch's for {messages[-1]['content']!r}"
        last = loaded.complete(messages, max_new_tokens=len(reply["reply_ids"]))
        assert last.text == reply["text"]
        assert last.prompt_tokens == len(reply["prompt_ids"])
        assert last.finish_reason == ("stop" if reply["reply_ids"][-1] in eos else "length")


def test_tiny_llama_greedy_equals_torch(tiny: anyformer.Loaded, tiny_llama_dir: Path, reference: Any) -> None:
    _check_replies(tiny, reference(tiny_llama_dir)["replies"])


def test_smollm2_greedy_equals_torch(smol: anyformer.Loaded, smollm2_dir: Path, reference: Any) -> None:
    replies = reference(smollm2_dir)["replies"]
    assert len(replies) == 3
    handle = smol.handle
    assert isinstance(handle, OnnxChatModel)
    # The graph that decodes is the rewritten one (rewrite/fused_graph.py), 30 layers of GroupQueryAttention.
    assert handle.details["graph"].startswith("attention fused into GroupQueryAttention (30 layers")
    _check_replies(smol, replies)


def test_load_reports_file_precision_and_provider(tiny: anyformer.Loaded) -> None:
    handle = tiny.handle
    assert isinstance(handle, OnnxChatModel)
    details = dict(handle.details)
    assert details.pop("graph").startswith("attention fused into GroupQueryAttention (2 layers")
    assert details == {
        "file": "onnx/model.onnx",
        "precision": "fp32",
        "provider": "CPUExecutionProvider",
        "context": 512,
    }


def test_seeded_sampling_repeats_and_differs_from_greedy(tiny: anyformer.Loaded) -> None:
    prompt = [{"role": "user", "content": "Hello there"}]
    first = tiny.complete(prompt, max_new_tokens=16, temperature=1.0, seed=7).text
    again = tiny.complete(prompt, max_new_tokens=16, temperature=1.0, seed=7).text
    assert first == again
    others = {tiny.complete(prompt, max_new_tokens=16, temperature=1.0, seed=s).text for s in range(4)}
    assert len(others) > 1, "four seeds gave the same sample"


def _repeats(text: str) -> int:
    return sum(a == b for a, b in itertools.pairwise(text))


def test_repetition_penalty_option_changes_greedy(tiny: anyformer.Loaded) -> None:
    prompt = [{"role": "user", "content": "aaaa"}]
    plain = tiny.complete(prompt, max_new_tokens=24).text
    penalised = tiny.complete(prompt, max_new_tokens=24, repetition_penalty=50.0).text
    assert plain != penalised
    # A strong penalty makes a repeated character rare: count repeats in each.
    assert _repeats(penalised) <= _repeats(plain)


def test_a_prompt_longer_than_the_context_is_bad_request(tiny_llama_dir: Path) -> None:
    with anyformer.load(str(tiny_llama_dir), backend="onnx", context=16) as loaded:
        with pytest.raises(AnyformerError) as caught:
            loaded.generate([{"role": "user", "content": "a long prompt that is more than sixteen characters"}])
        assert caught.value.code == ErrorCode.BAD_REQUEST


def test_bad_sampling_options_are_bad_request(tiny: anyformer.Loaded) -> None:
    for options in ({"top_k": -1}, {"top_p": 0}, {"repetition_penalty": "x"}):
        with pytest.raises(AnyformerError) as caught:
            tiny.generate("hi", temperature=0.5, **options)
        assert caught.value.code == ErrorCode.BAD_REQUEST
