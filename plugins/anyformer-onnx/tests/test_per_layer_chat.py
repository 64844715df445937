"""Text chat on a Gemma 3n-style export: a decoder with per-layer inputs, one graph per module, against torch.

The fixture (per_layer_exports.py) built a tiny random ``Gemma3nForCausalLM`` (AltUp, LAuReL,
per-layer inputs, KV sharing, soft-capped logits) over a character vocabulary, recorded torch's
greedy reply to each prompt and the logits of every step (each step computed on the whole sequence
without a cache), then exported ``embed_tokens`` (→ ``inputs_embeds``, ``per_layer_inputs``) and
``decoder_model_merged`` reading both. Here the backend's loop is compared with those, and the
tests show that the comparison would catch a loop that fed per-layer inputs or the cache wrongly.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from teacher_forcing import Teacher, largest_gap, replies, step_logits

import anyformer
from anyformer.plugin import AnyformerError, Caps, ErrorCode, Model, Refusal, Request
from anyformer_onnx import plugin
from anyformer_onnx.chat.decoder import DecodeLoop
from anyformer_onnx.chat.per_layer import PER_LAYER_INPUTS, declares_per_layer_inputs
from anyformer_onnx.tasks.names import TEXT_GENERATION
from anyformer_onnx.tasks.registry import task_of


@pytest.fixture(scope="module")
def gemma3n(gemma3n_dir: Path) -> Iterator[Any]:
    """The tiny Gemma 3n loaded once."""
    with anyformer.load(str(gemma3n_dir), backend="onnx") as loaded:
        yield loaded


def test_the_graphs_carry_per_layer_inputs(gemma3n: Any, gemma3n_dir: Path) -> None:
    """What was loaded: the decoder reads per_layer_inputs, has a cache for the two non-shared layers only."""
    graph = gemma3n.handle.loop.graph
    assert graph.per_layer and graph.takes_embeds
    assert graph.past_names == [f"past_key_values.{i}.{p}" for i in (0, 1) for p in ("key", "value")]
    assert gemma3n.handle.media.per_layer
    assert declares_per_layer_inputs(json.loads((gemma3n_dir / "config.json").read_text()))
    embedded = gemma3n.handle.media.embed_inputs([5, 6, 95, 97])  # 95 and 97 lie past the per-layer table
    assert embedded["inputs_embeds"].shape == (1, 4, 64)
    assert embedded[PER_LAYER_INPUTS].shape == (1, 4, 4, 16)
    # Ids past vocab_size_per_layer_input read the table's row 0, as transformers' get_per_layer_inputs does.
    zero = gemma3n.handle.media.embed_inputs([0])[PER_LAYER_INPUTS][0, 0]
    np.testing.assert_array_equal(embedded[PER_LAYER_INPUTS][0, 2], zero)
    np.testing.assert_array_equal(embedded[PER_LAYER_INPUTS][0, 3], zero)


def test_step_logits_equal_torch(gemma3n: Any, gemma3n_dir: Path) -> None:
    """Each step's logits (the prompt, then torch's reply token by token, through the cache) equal torch's."""
    for reply in replies(gemma3n_dir):
        got = step_logits(gemma3n.handle.loop, reply)
        assert len(got) == len(reply["logits"]) >= 8
        for index, (row, want) in enumerate(zip(got, reply["logits"], strict=True)):
            np.testing.assert_allclose(row, want, atol=2e-4, err_msg=f"{reply['messages'][-1]['content']} step {index}")


def test_greedy_replies_equal_torch(gemma3n: Any, gemma3n_dir: Path) -> None:
    """generate() at temperature 0 gives torch's greedy reply, its text and its prompt length."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(gemma3n_dir / "tokenizer.json"))
    for reply in replies(gemma3n_dir):
        assert gemma3n.handle.text.prompt_ids(reply["messages"], False) == reply["prompt_ids"]
        chunks = list(gemma3n.generate(reply["messages"], max_new_tokens=len(reply["reply_ids"]), temperature=0))
        want = [t for t in reply["reply_ids"] if t != 2]
        assert "".join(c.delta for c in chunks) == tokenizer.decode(want)
        assert chunks[-1].tokens == len(want)
        assert chunks[-1].prompt_tokens == len(reply["prompt_ids"])


def test_per_layer_inputs_of_other_tokens_change_the_logits(gemma3n: Any, gemma3n_dir: Path) -> None:
    """The comparison can fail: per-layer inputs that are not each step's own tokens' move the logits off torch's."""
    media = gemma3n.handle.media

    def stale(ids: list[int]) -> dict[str, np.ndarray]:
        found = media.embed_inputs(ids)
        found[PER_LAYER_INPUTS] = media.embed_inputs([0] * len(ids))[PER_LAYER_INPUTS]
        return found

    loop = DecodeLoop(gemma3n.handle.loop.graph, "cpu", stale)
    reply = replies(gemma3n_dir)[0]
    teacher = Teacher(reply["reply_ids"])
    list(loop.tokens(reply["prompt_ids"], teacher, limit=len(reply["reply_ids"]), stop_ids=frozenset({2})))
    assert largest_gap(teacher.logits, reply["logits"]) > 1e-2


def test_a_cache_not_fed_back_changes_the_logits(gemma3n: Any, gemma3n_dir: Path) -> None:
    """The comparison can fail: a loop that feeds back zeros of the cache's shape drifts off torch's logits."""

    class Forgetful(DecodeLoop):
        def step(self, ids: list[int], total: int, cache: dict[str, Any], *rest: Any) -> Any:
            blank = {name: self._value(np.zeros_like(value.numpy())) for name, value in cache.items()}
            return super().step(ids, total, blank, *rest)

    loop = Forgetful(gemma3n.handle.loop.graph, "cpu", gemma3n.handle.media.embed_inputs)
    reply = replies(gemma3n_dir)[0]
    teacher = Teacher(reply["reply_ids"])
    list(loop.tokens(reply["prompt_ids"], teacher, limit=len(reply["reply_ids"]), stop_ids=frozenset({2})))
    np.testing.assert_allclose(teacher.logits[0], reply["logits"][0], atol=2e-4)  # the prompt step needs no cache
    assert largest_gap(teacher.logits[1:], reply["logits"][1:]) > 1e-2


def test_image_and_audio_blocks_are_bad_request(gemma3n: Any) -> None:
    for block in ({"type": "image", "image": b"\x89PNG"}, {"type": "audio", "audio": b"RIFF"}):
        messages = [{"role": "user", "content": [block, {"type": "text", "text": "?"}]}]
        with pytest.raises(AnyformerError) as caught:
            list(gemma3n.generate(messages, max_new_tokens=2, temperature=0))
        assert caught.value.code == ErrorCode.BAD_REQUEST
        # The core refuses audio before the handle sees it (the handle says it reads none); images reach it.
        assert ("per-layer inputs" if block["type"] == "image" else "audio") in str(caught.value)


def test_an_embed_tokens_without_per_layer_inputs_is_bad_model(
    gemma3n_dir: Path, llava_dir: Path, tmp_path: Path
) -> None:
    """A per-layer decoder beside an embed_tokens returning inputs_embeds alone: refused at load, naming the input."""
    folder = tmp_path / "mixed"
    shutil.copytree(gemma3n_dir, folder)
    shutil.copy(llava_dir / "onnx" / "embed_tokens.onnx", folder / "onnx" / "embed_tokens.onnx")
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(str(folder), backend="onnx")
    assert caught.value.code == ErrorCode.BAD_MODEL
    assert PER_LAYER_INPUTS in str(caught.value)


def test_a_decoder_state_it_does_not_feed_is_still_bad_model(gemma3n_dir: Path, tmp_path: Path) -> None:
    """A decoder with another extra input (here a Mamba hybrid's state) stays refused, named."""
    import onnx
    from onnx import TensorProto, helper

    folder = tmp_path / "hybrid"
    shutil.copytree(gemma3n_dir, folder)
    path = folder / "onnx" / "decoder_model_merged.onnx"
    graph = onnx.load(str(path))
    graph.graph.input.append(helper.make_tensor_value_info("past_ssm.0", TensorProto.FLOAT, [1, 8, 3]))
    onnx.save(graph, str(path))
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(str(folder), backend="onnx")
    assert caught.value.code == ErrorCode.BAD_MODEL
    assert "past_ssm.0" in str(caught.value)


# ---- can_run on descriptions alone ---------------------------------------------------------------

_GEMMA3N_CONFIG = {
    "architectures": ["Gemma3nForConditionalGeneration"],
    "model_type": "gemma3n",
    "text_config": {
        "hidden_size": 2048,
        "hidden_size_per_layer_input": 256,
        "num_hidden_layers": 30,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "max_position_embeddings": 32768,
    },
}
_GEMMA3N_FILES = [
    ("onnx/embed_tokens_q4.onnx", 10**8),
    ("onnx/decoder_model_merged_q4.onnx", 10**9),
    ("onnx/vision_encoder_q4.onnx", 3 * 10**8),
    ("onnx/audio_encoder_q4.onnx", 3 * 10**8),
    ("config.json", 10),
    ("tokenizer.json", 10),
]


def _model(files: list[tuple[str, int]], config: dict[str, Any], **fields: Any) -> Model:
    model = Model.from_dict({"repo": "org/gemma-3n", "files": [{"name": n, "size": s} for n, s in files], **fields})
    return Model(**{**model.__dict__, "config": config})


def _verdict(model: Model, **request: Any) -> Any:
    caps = Caps(ram_bytes=16 * 10**9, store=True, cpu_count=2)
    return plugin.can_run(model=model, caps=caps, request=Request.build(**request))


def test_can_run_reads_embed_tokens_and_the_decoder_for_text() -> None:
    """A Gemma 3n repo (tagged image-text-to-text on the Hub) is text chat; its encoders are not fetched."""
    model = _model(_GEMMA3N_FILES, _GEMMA3N_CONFIG, task="image-text-to-text")
    assert task_of(model, None) == TEXT_GENERATION
    verdict = _verdict(model)
    assert verdict.ok, verdict.reason
    choice = plugin.plan(model, Caps(ram_bytes=16 * 10**9, store=True, cpu_count=2), Request.build())[1]
    assert choice is not None
    assert [part.graph.name for part in choice.parts] == [
        "onnx/embed_tokens_q4.onnx",
        "onnx/decoder_model_merged_q4.onnx",
    ]


@pytest.mark.parametrize("task", ["image-text-to-text", "audio-text-to-text"])
def test_can_run_refuses_media_tasks_naming_the_family(task: str) -> None:
    verdict = _verdict(_model(_GEMMA3N_FILES, _GEMMA3N_CONFIG), task=task)
    assert not verdict.ok
    assert verdict.code == Refusal.MODEL
    assert "per-layer inputs" in verdict.reason


def test_can_run_still_needs_both_text_graphs() -> None:
    files = [f for f in _GEMMA3N_FILES if "decoder_model_merged" not in f[0]]
    verdict = _verdict(_model(files, _GEMMA3N_CONFIG))
    assert not verdict.ok
    assert verdict.code == Refusal.MODEL
