"""Older GGUFs naming no pre-tokenizer (or ``default``) split as llama.cpp's DEFAULT pre-tokenizer, against its
``Llama.tokenize`` on a vocabulary whose merges join only across boundaries one of the four expressions draws.

Each merge below is reachable only where some expression did not cut: a space before punctuation, an apostrophe
before ``s`` or a backquote after a bracket (the punctuation run), letters across a space (GPT-2's word rule), a
space before digits (the digit run) and digits across a run of three (the three-digit rule).
"""

from __future__ import annotations

import dataclasses

import pytest
from vocab_gguf import vocab_only_llama

from anyformer_gguf_gpu.testing import byte_level_alphabet
from anyformer_gguf_gpu.tokenizer import PRE_TOKENIZERS, GGUFTokenizer, tokenizer_problem

MERGES = [
    "Ġ 1", "Ġ 7", "1 2", "3 4", "12 34", "4 5", "Ġ (", "( `", "' s", "! !", "Ġ t", "h e", "Ġt he", "e Ġ", "a b", "ab c",
    "x y", "Ġ Ġ", "Ċ Ċ", "o Ġ", "Ġ w", "d .", ". Ġ", "Ġ $", "= =", "a +", "+ b",
]  # fmt: skip
CORPUS = [
    "Hello world",
    "the there  them",
    "it's IT'S he's don't",
    "(`code`) ( `x`",
    "12345 1234 123456789 12",
    "a1234b 7 77 777 7777",
    "Wow!! Really?! ...",
    "$100 + $5 == $105",
    "a+b=c x<=y p^q~r|s",
    "50% of 1,000,000.5",
    "mail@example.com, https://x.org/a?b=c&d",
    "日本語 😀 ١٢٣٤ ²³ ab's",
    "Привет, мир! ¿Qué tal? «quotes» — dash",
    "tabs\t\tand\r\nnewlines\n\n\n  \n",
    "   leading and trailing   ",
    "def f(x):\n    return x**2  # comment\n",
    "abc123abc xyz",
    "end.  next. d.",
    "'quoted' \"double\" `back`",
    "[1, 2, 3] {a: b} <tag/>",
    "",
]


def _tokens() -> list[str]:
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *byte_level_alphabet()]
    return tokens + list(dict.fromkeys(m.replace(" ", "") for m in MERGES if m.replace(" ", "") not in tokens))


def _kv(pre: str | None, add_bos: bool | None) -> dict[str, object]:
    tokens = _tokens()
    kv: dict[str, object] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (len(tokens) - 3),
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 2,
    }
    if pre is not None:
        kv["tokenizer.ggml.pre"] = pre
    if add_bos is not None:
        kv["tokenizer.ggml.add_bos_token"] = add_bos
    return kv


#: (tokenizer.ggml.pre, tokenizer.ggml.add_bos_token): no key at all (llama.cpp's defaults for both), and
#: ``default`` named with BOS asked for.
VOCABS = [(None, None), ("default", True)]


@pytest.fixture(scope="module", params=VOCABS, ids=["no-pre", "default-bos"])
def vocab(request, tmp_path_factory):
    """The header values and llama.cpp on a vocabulary-only GGUF written from them."""
    kv = _kv(*request.param)
    return kv, vocab_only_llama(tmp_path_factory.mktemp("default-pre-vocab"), kv)


@pytest.mark.parametrize("add_special", [True, False], ids=["bos", "no-bos"])
def test_default_pre_tokenizer_splits_like_llama_cpp(vocab, add_special):
    kv, llama = vocab
    ours = GGUFTokenizer(kv)
    for text in CORPUS:
        expected = llama.tokenize(text.encode(), add_bos=add_special, special=False)
        assert ours.encode(text, add_special=add_special, parse_special=False) == expected, repr(text)


def test_bos_follows_the_header(vocab):
    """The vocabulary asking for BOS gets it first; the one without the key gets llama.cpp's default."""
    kv, llama = vocab
    ids = GGUFTokenizer(kv).encode("Hello", parse_special=False)
    assert ids == llama.tokenize(b"Hello", add_bos=True, special=False)
    if kv.get("tokenizer.ggml.add_bos_token"):
        assert ids[0] == 0


@pytest.mark.parametrize("dropped", range(4))
def test_every_expression_matters(vocab, dropped, monkeypatch):
    """Dropping any one of the four expressions gets some text wrong: the agreement above is no accident of the
    vocabulary, and each expression is pinned by the corpus."""
    kv, llama = vocab
    default = PRE_TOKENIZERS["default"]
    kept = tuple(e for i, e in enumerate(default.expressions) if i != dropped)
    monkeypatch.setitem(PRE_TOKENIZERS, "default", dataclasses.replace(default, expressions=kept))
    mutant = GGUFTokenizer(kv)
    wrong = [
        t
        for t in CORPUS
        if mutant.encode(t, add_special=False, parse_special=False)
        != llama.tokenize(t.encode(), add_bos=False, special=False)
    ]
    assert len(wrong) >= 2, f"dropping expression {dropped} ({default.expressions[dropped]}) broke only {wrong}"


def test_missing_and_default_pre_are_read_not_refused():
    from anyformer_gguf_gpu.model_choice import tokenizer_problem as summary_problem

    assert tokenizer_problem(_kv(None, None)) is None
    assert tokenizer_problem(_kv("default", None)) is None
    assert tokenizer_problem(_kv("", None)) is None
    # can_run reads the description's summary, where a missing key is None
    assert summary_problem({"tokenizer_model": "gpt2", "tokenizer_pre": None}) is None
    assert summary_problem({"tokenizer_model": "gpt2", "tokenizer_pre": "default"}) is None
