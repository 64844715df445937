"""The checks the GGUF backends share (model_choice, chat_setup, config): each refusal, its order and its words."""

from __future__ import annotations

from typing import Any

import pytest

from anyformer.plugin import AnyformerError, ErrorCode, Estimate, GGUFTensor, Model, Refusal, Request, Verdict
from anyformer_gguf_gpu.chat_setup import check_prompt_fits, check_text_only
from anyformer_gguf_gpu.config import expect_shapes, header_int, read_attention_dims
from anyformer_gguf_gpu.model_choice import GgufChoice, choose_and_judge, task_refusal, tokenizer_problem

FACTS: dict[str, Any] = {"architecture": "llama", "tokenizer_model": "gpt2", "tokenizer_pre": "smollm", "split": None}


def described(files: list[str], facts: dict[str, Any] | None = FACTS, **extra: Any) -> Model:
    metadata: dict[str, Any] = {} if facts is None else {"gguf": facts, "gguf_file": files[0]}
    return Model.from_dict(
        {"repo": "o/r", "files": [{"name": n, "size": 10} for n in files], "metadata": metadata, **extra}
    )


def judged(model: Model, request: dict[str, Any] | None = None, problem: str | None = None, fits: int = 10**12):
    """choose_and_judge with a preference of Q4_0 then Q8_0, and a judge that fits files of ``fits`` bytes or fewer."""

    def judge(choice: GgufChoice) -> Verdict:
        if choice.size > fits:
            return Verdict.refuse("b", Refusal.BUDGET, f"{choice.file.name} is too big", need=choice.size)
        return Verdict.accept("b", Estimate(details={"file": choice.file.name, "estimated": choice.estimated}))

    return choose_and_judge(
        "b",
        model,
        Request(**(request or {})),
        preference=("Q4_0", "Q8_0"),
        readable_quants=("Q4_0", "Q8_0", "BF16"),
        model_problem=lambda summary: problem,
        judge=judge,
    )


def sized(files: dict[str, int], **extra: Any) -> Model:
    return Model.from_dict(
        {"repo": "o/r", "architecture": "llama", "files": [{"name": n, "size": s} for n, s in files.items()], **extra}
    )


def test_the_backends_preference_decides_not_the_listing_order():
    model = sized({"m-BF16.gguf": 400, "m-Q8_0.gguf": 200, "m-Q4_0.gguf": 100})
    v = judged(model)
    assert v.ok and v.estimate.details == {"file": "m-Q4_0.gguf", "estimated": True}


def test_a_file_that_does_not_fit_gives_way_to_the_next_smaller_one():
    model = sized({"m-BF16.gguf": 400, "m-Q8_0.gguf": 200, "m-Q4_0.gguf": 100, "m-Q2_K.gguf": 50})
    v = judged(model, {"options": {"file": "m-BF16.gguf"}}, fits=300)
    assert not v.ok and v.code is Refusal.BUDGET  # named: judged alone
    model = sized({"m-Q8_0.gguf": 200, "m-Q4_0.gguf": 300, "m-x.gguf": 150})
    v = judged(model, fits=250)
    assert v.ok and v.estimate.details["file"] == "m-Q8_0.gguf"
    v = judged(model, fits=100)
    assert not v.ok and v.need == 150 and "smallest of 3 files tried" in v.reason


def test_the_file_option_picks_and_an_unknown_name_lists_the_weight_files():
    model = sized({"m-Q8_0.gguf": 200, "m-Q4_0.gguf": 100, "mmproj-f16.gguf": 5})
    assert judged(model, {"options": {"file": "m-Q8_0.gguf"}}).estimate.details["file"] == "m-Q8_0.gguf"
    with pytest.raises(AnyformerError, match=r"its weight files: m-Q8_0\.gguf, m-Q4_0\.gguf") as caught:
        judged(model, {"options": {"file": "mmproj-f16.gguf"}})
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_split_sets_are_one_candidate_and_an_incomplete_one_names_its_missing_shard():
    model = sized({"BF16/m-BF16-00001-of-00002.gguf": 300, "BF16/m-BF16-00002-of-00002.gguf": 300})
    v = judged(model)
    assert v.ok and v.estimate.details["file"] == "BF16/m-BF16-00001-of-00002.gguf"
    v = judged(sized({"m-Q4_0-00001-of-00003.gguf": 1, "m-Q4_0-00003-of-00003.gguf": 1}))
    assert v.code is Refusal.MODEL and "lacks m-Q4_0-00002-of-00003.gguf" in v.reason


@pytest.mark.parametrize(
    ("model", "request_", "code", "words"),
    [
        (described(["model.safetensors"]), {}, Refusal.FORMAT, "no GGUF in the repo"),
        (described(["model.gguf"]), {"task": "feature-extraction"}, Refusal.TASK, "not feature-extraction"),
        (
            described(["model.gguf"], task="image-text-to-text"),
            {"task": "image-text-to-text"},
            Refusal.TASK,
            "not image",
        ),
        (described(["mmproj.gguf"]), {}, Refusal.MODEL, "only projectors"),
        (described(["model.gguf"]), {}, Refusal.MODEL, "model.gguf: the header says no"),
        (described(["m-IQ2_M.gguf"]), {}, Refusal.MODEL, "the repo has IQ2_M"),
        (described(["model.gguf"], facts=None), {}, Refusal.MODEL, "the header was not read and no architecture"),
    ],
)
def test_refusals_in_order(model: Model, request_: dict[str, Any], code: Refusal, words: str):
    v = judged(model, request_, problem="the header says no")
    assert isinstance(v, Verdict) and not v.ok and v.code is code and words in v.reason, v


def test_an_image_text_to_text_repo_runs_as_text_chat_when_no_task_is_asked():
    model = described(["model.gguf"], task="image-text-to-text")
    assert task_refusal("b", model, Request()) is None
    assert task_refusal("b", described(["model.gguf"], task="any-to-any"), Request()) is None


def test_the_header_is_read_when_the_description_has_it():
    v = judged(described(["model.gguf"]))
    assert v.ok and v.estimate.details["estimated"] is False
    v = judged(described(["model.gguf"], {**FACTS, "split": {"count": 2}}))
    assert v.code is Refusal.MODEL and "one shard of a split set of 2" in v.reason


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
