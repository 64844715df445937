"""Text chat on a Qwen3.5-style hybrid decoder: linear-attention layers carry fixed-size states, against torch.

The fixture (per_layer_exports.py) built a tiny random ``Qwen3_5ForCausalLM`` (three gated-DeltaNet
layers, one full-attention layer with M-RoPE) over a character vocabulary, recorded torch's greedy
reply to each prompt and every step's logits (on the whole sequence, no cache), then exported one
graph with transformers.js's cache names: ``past_conv.i`` / ``past_recurrent.i`` beside
``past_key_values.2.key/value``. Here the loop's logits are compared with those, and the tests show
the comparison would catch states that were not carried from step to step.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from teacher_forcing import Teacher, largest_gap, replies

import anyformer
from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_onnx.chat.decoder import DecodeLoop

#: How far the loop's logits may be from torch's.
TOLERANCE = 2e-4


@pytest.fixture(scope="module")
def qwen35(qwen35_dir: Path) -> Iterator[Any]:
    with anyformer.load(str(qwen35_dir), backend="onnx") as loaded:
        yield loaded


def _run(loop: DecodeLoop, reply: dict[str, Any]) -> list[np.ndarray]:
    teacher = Teacher(reply["reply_ids"])
    list(loop.tokens(reply["prompt_ids"], teacher, limit=len(reply["reply_ids"]), stop_ids=frozenset({2})))
    return teacher.logits


def test_the_states_are_read_in_layer_order(qwen35: Any) -> None:
    graph = qwen35.handle.loop.graph
    assert graph.past_names == ["past_key_values.2.key", "past_key_values.2.value"]
    assert [(s.name, s.present, s.shape) for s in graph.states] == [
        ("past_conv.0", "present_conv.0", (1, 96, 4)),
        ("past_recurrent.0", "present_recurrent.0", (1, 4, 16, 8)),
        ("past_conv.1", "present_conv.1", (1, 96, 4)),
        ("past_recurrent.1", "present_recurrent.1", (1, 4, 16, 8)),
        ("past_conv.3", "present_conv.3", (1, 96, 4)),
        ("past_recurrent.3", "present_recurrent.3", (1, 4, 16, 8)),
    ]
    cache = qwen35.handle.loop.empty_cache()
    assert not cache["past_recurrent.3"].numpy().any()
    assert cache["past_key_values.2.key"].shape() == [1, 2, 0, 16]


def test_step_logits_equal_torch(qwen35: Any, qwen35_dir: Path) -> None:
    """Each step's logits (the prompt, then torch's reply token by token, states carried) equal torch's."""
    for reply in replies(qwen35_dir):
        got = _run(qwen35.handle.loop, reply)
        assert len(got) == len(reply["logits"]) >= 8
        for index, (row, want) in enumerate(zip(got, reply["logits"], strict=True)):
            np.testing.assert_allclose(row, want, atol=TOLERANCE, err_msg=f"step {index}")


def test_greedy_replies_equal_torch(qwen35: Any, qwen35_dir: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(qwen35_dir / "tokenizer.json"))
    for reply in replies(qwen35_dir):
        assert qwen35.handle.text.prompt_ids(reply["messages"], False) == reply["prompt_ids"]
        chunks = list(qwen35.generate(reply["messages"], max_new_tokens=len(reply["reply_ids"]), temperature=0))
        want = [t for t in reply["reply_ids"] if t != 2]
        assert "".join(c.delta for c in chunks) == tokenizer.decode(want)
        assert chunks[-1].prompt_tokens == len(reply["prompt_ids"])


@pytest.mark.parametrize("lost", ["past_conv.", "past_recurrent."])
def test_states_not_carried_change_the_logits(qwen35: Any, qwen35_dir: Path, lost: str) -> None:
    """The comparison can fail: a loop that feeds back zeros for either kind of state drifts off torch's logits."""

    class Forgetful(DecodeLoop):
        def step(self, ids: list[int], total: int, cache: dict[str, Any], *rest: Any) -> Any:
            fed = {
                name: self._value(np.zeros_like(value.numpy())) if name.startswith(lost) else value
                for name, value in cache.items()
            }
            return super().step(ids, total, fed, *rest)

    loop = Forgetful(qwen35.handle.loop.graph, "cpu")
    reply = replies(qwen35_dir)[0]
    got = _run(loop, reply)
    np.testing.assert_allclose(got[0], reply["logits"][0], atol=TOLERANCE)  # the prompt step starts from zeros anyway
    # Far outside what test_step_logits_equal_torch accepts.
    assert largest_gap(got[1:], reply["logits"][1:]) > 10 * TOLERANCE


def test_a_state_without_its_present_is_bad_model(qwen35_dir: Path, tmp_path: Path) -> None:
    import onnx

    folder = tmp_path / "broken"
    shutil.copytree(qwen35_dir, folder)
    path = folder / "onnx" / "model.onnx"
    graph = onnx.load(str(path))
    kept = [o for o in graph.graph.output if o.name != "present_recurrent.1"]
    del graph.graph.output[:]
    graph.graph.output.extend(kept)
    onnx.save(graph, str(path))
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(str(folder), backend="onnx", options={"fuse_attention": False})
    assert caught.value.code == ErrorCode.BAD_MODEL
    assert "past_recurrent.1" in str(caught.value) and "present_recurrent.1" in str(caught.value)
