"""The checks the GGUF backends share (model_choice, chat_setup, config): each refusal, its order and its words."""

from __future__ import annotations

from typing import Any

import pytest

from anyformer.plugin import AnyformerError, Caps, ErrorCode, GGUFTensor, Model, Refusal, Request, Verdict
from anyformer_gguf_gpu.chat_setup import check_prompt_fits, check_text_only
from anyformer_gguf_gpu.config import expect_shapes, header_int, read_attention_dims
from anyformer_gguf_gpu.model_choice import GgufChoice, choose_gguf, gguf_refusal, store_refusal, tokenizer_problem

FACTS: dict[str, Any] = {"architecture": "llama", "tokenizer_model": "gpt2", "tokenizer_pre": "smollm", "split": None}


def described(files: list[str], facts: dict[str, Any] | None = FACTS, **extra: Any) -> Model:
    metadata: dict[str, Any] = {} if facts is None else {"gguf": facts}
    return Model.from_dict(
        {"repo": "o/r", "files": [{"name": n, "size": 10} for n in files], "metadata": metadata, **extra}
    )


def test_choose_gguf_picks_the_one_language_model_file_and_says_why_not_otherwise():
    choice = choose_gguf(described(["model.gguf", "mmproj-model.gguf"], gguf_file="model.gguf"))
    assert choice == GgufChoice(choice.file, FACTS) and choice.file.name == "model.gguf"
    assert choose_gguf(described(["mmproj-f16.gguf"])) == "no language-model GGUF (only projectors)"
    assert "header was not read" in choose_gguf(described(["model.gguf"], facts=None))
    assert "header was not read" in choose_gguf(described(["a.gguf", "b.gguf"]))
    assert "one shard of a split set" in choose_gguf(described(["m-00001-of-00002.gguf"]))
    assert "one shard of a split set" in choose_gguf(described(["m.gguf"], {**FACTS, "split": {"count": 2}}))


@pytest.mark.parametrize(
    ("model", "request_", "code", "words"),
    [
        (described(["model.safetensors"]), {}, Refusal.FORMAT, "no GGUF in the repo"),
        (described(["model.gguf"]), {"task": "feature-extraction"}, Refusal.TASK, "not feature-extraction"),
        (described(["mmproj.gguf"]), {}, Refusal.MODEL, "only projectors"),
        (described(["model.gguf"]), {}, Refusal.MODEL, "model.gguf: the header says no"),
    ],
)
def test_gguf_refusal_in_order(model: Model, request_: dict[str, Any], code: Refusal, words: str):
    v = gguf_refusal("b", model, Request(**request_), lambda summary: "the header says no")
    assert isinstance(v, Verdict) and not v.ok and v.code is code and words in v.reason, v


def test_gguf_refusal_returns_the_choice_when_the_header_is_read():
    choice = gguf_refusal("b", described(["model.gguf"]), Request(), lambda summary: None)
    assert isinstance(choice, GgufChoice) and choice.summary is not None


def test_store_refusal_only_for_a_hub_file_without_a_writable_store():
    hub = described(["model.gguf"], source="hub")
    file = hub.files_of("gguf")[0]
    refused = store_refusal("b", hub, Caps(store=False), file)
    assert refused is not None and refused.code is Refusal.STORE and "not writable" in refused.reason
    assert store_refusal("b", hub, Caps(store=True), file) is None


def test_tokenizer_problem_names_the_model_or_the_pre_tokenizer():
    assert tokenizer_problem(FACTS) is None
    assert "tokenizer model 'llama'" in str(tokenizer_problem({**FACTS, "tokenizer_model": "llama"}))
    assert "'deepseek-llm'" in str(tokenizer_problem({**FACTS, "tokenizer_pre": "deepseek-llm"}))


def test_prompt_checks():
    check_prompt_fits([1, 2], 3)
    for ids, words in (([], "empty"), ([1, 2, 3], "3 tokens; the context holds 3")):
        with pytest.raises(AnyformerError, match=words) as caught:
            check_prompt_fits(ids, 3)
        assert caught.value.code is ErrorCode.BAD_REQUEST
    check_text_only([{"role": "user", "content": "hi"}], "b")
    image = [{"role": "user", "content": [{"type": "image", "image": "x.png"}]}]
    with pytest.raises(AnyformerError, match="the b backend reads text only"):
        check_text_only(image, "b")


def test_header_int_reads_uniform_per_layer_arrays_only_when_asked():
    assert header_int({"k": [4, 4]}, "k") == 4
    with pytest.raises(AnyformerError, match="varies per layer"):
        header_int({"k": [4, 2]}, "k")
    with pytest.raises(AnyformerError, match="not a positive integer"):
        header_int({"k": [4, 4]}, "k", uniform_list=False)
    assert header_int({}, "k", 7) == 7


@pytest.mark.parametrize(
    ("kv", "words"),
    [
        ({"a.attention.head_count": 3, "a.attention.head_count_kv": 2}, "do not group"),
        ({"a.attention.value_length": 8}, "different widths"),
        ({"a.rope.dimension_count": 15}, "rope dimension 15"),
    ],
)
def test_attention_dims_refuse_what_does_not_fit(kv: dict[str, Any], words: str):
    base = {"a.embedding_length": 64, "a.attention.head_count": 4}
    with pytest.raises(AnyformerError, match=words) as caught:
        read_attention_dims({**base, **kv}, "a")
    assert caught.value.code is ErrorCode.BAD_MODEL
    dims = read_attention_dims(base, "a")
    assert (dims.n_kv, dims.head_dim, dims.n_rot) == (4, 16, 16)


def test_expect_shapes_reports_the_first_tensor_that_differs():
    tensors = {
        "x": GGUFTensor(name="x", dims=(4,), ggml_type=0, offset=0, nbytes=16),
        "y": GGUFTensor(name="y", dims=(4,), ggml_type=23, offset=0, nbytes=16),
    }
    expect_shapes({"x": (4,)}, tensors, "unread")
    with pytest.raises(AnyformerError, match=r"x has shape \(4,\), the header implies \(5,\)"):
        expect_shapes({"x": (5,), "y": (4,)}, tensors, "unread")
    with pytest.raises(AnyformerError, match="y is IQ4_XS, which nothing reads"):
        expect_shapes({"y": (4,)}, tensors, "which nothing reads")
    with pytest.raises(AnyformerError, match="no tensor z"):
        expect_shapes({"z": (4,)}, tensors, "unread")


def test_token_chunk_carries_the_prompt_once_and_finishes_at_the_limit(tmp_path):
    from anyformer_gguf_gpu.chat_setup import token_chunk
    from anyformer_gguf_gpu.gguf_file import GGUFFile
    from anyformer_gguf_gpu.testing import RandomModel, write_random_gguf
    from anyformer_gguf_gpu.tokenizer import GGUFTokenizer, StreamDecoder

    path = str(tmp_path / "tiny.gguf")
    write_random_gguf(path, RandomModel(n_layer=1))
    gguf = GGUFFile(path)
    try:
        tokenizer = GGUFTokenizer(gguf.kv)
    finally:
        gguf.close()
    ids = tokenizer.encode("the cat", add_special=False, parse_special=False)
    text = StreamDecoder(tokenizer)
    chunks = [token_chunk(text, t, i + 1, len(ids), 7) for i, t in enumerate(ids)]
    assert "".join(c.delta for c in chunks) == "the cat"
    assert [c.prompt_tokens for c in chunks] == [7] + [None] * (len(ids) - 1)
    assert [c.finish_reason for c in chunks] == [None] * (len(ids) - 1) + ["length"]
    assert [c.tokens for c in chunks] == list(range(1, len(ids) + 1))
