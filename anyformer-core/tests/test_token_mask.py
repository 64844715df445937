"""The core's constrained decoding (``anyformer.plugin.ConstraintVocabulary`` / ``TokenMask``) on a tiny BPE
vocabulary trained here: the masked walk can only spell what the constraint allows, whatever the logits say."""

from __future__ import annotations

import json
import re
import sys

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("llguidance")
tokenizers = pytest.importorskip("tokenizers")

from anyformer.plugin import AnyformerError, Constraint, ConstraintVocabulary, ErrorCode  # noqa: E402

_TEXTS = [
    '{"name": "Ada", "age": 36, "ok": true}',
    '{"city": "Paris", "temperature": -3.5, "tags": ["a", "b"]}',
    "the quick brown fox jumps over the lazy dog 0123456789 yes no",
]
_END = "<|end|>"
#: Logits rows longer than the tokenizer's vocabulary, as a padded embedding table makes them.
_PADDING = 5


@pytest.fixture(scope="module")
def tokenizer() -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=[_END], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_TEXTS * 20, trainer)
    return tok


@pytest.fixture(scope="module")
def vocabulary(tokenizer: object) -> ConstraintVocabulary:
    end = tokenizer.token_to_id(_END)  # type: ignore[attr-defined]
    n_vocab = tokenizer.get_vocab_size() + _PADDING  # type: ignore[attr-defined]
    return ConstraintVocabulary.from_tokenizer(tokenizer, n_vocab=n_vocab, end_ids=[end], install="pip install x")


def _walk(vocabulary: ConstraintVocabulary, tokenizer: object, constraint: Constraint, seed: int) -> str:
    """Greedy over random logits under the mask until the value is complete; the text it spelt."""
    rng = np.random.default_rng(seed)
    mask = vocabulary.mask_for(constraint)
    end = tokenizer.token_to_id(_END)  # type: ignore[attr-defined]
    ids: list[int] = []
    for _ in range(200):
        logits = rng.normal(size=mask.n_vocab).astype(np.float32)
        logits[end] -= 3.0  # end late, so the walk visits more of the language
        before = logits.copy()
        token = int(mask.masked(logits).argmax())
        assert np.array_equal(logits, before), "masked() wrote to the logits it was given"
        if token == end:
            break
        mask.consume(token)
        ids.append(token)
        if mask.finished:
            break
    else:
        pytest.fail("the masked walk did not end in 200 tokens")
    return str(tokenizer.decode(ids))  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", range(4))
def test_a_masked_walk_spells_only_what_the_regex_matches(
    vocabulary: ConstraintVocabulary, tokenizer: object, seed: int
) -> None:
    pattern = r"(yes|no) [0-9]{2,4}"
    text = _walk(vocabulary, tokenizer, Constraint.build({"type": "regex", "regex": pattern}), seed)
    assert re.fullmatch(pattern, text), text


@pytest.mark.parametrize("seed", range(4))
def test_a_masked_walk_spells_json_that_validates(
    vocabulary: ConstraintVocabulary, tokenizer: object, seed: int
) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "age": {"type": "integer"}},
        "required": ["ok", "age"],
        "additionalProperties": False,
    }
    text = _walk(vocabulary, tokenizer, Constraint.json_schema(schema), seed)
    value = json.loads(text)
    assert set(value) == {"ok", "age"} and isinstance(value["ok"], bool) and isinstance(value["age"], int), text


def test_tokens_past_the_tokenizers_vocabulary_are_never_allowed(vocabulary: ConstraintVocabulary) -> None:
    mask = vocabulary.mask_for(Constraint.build({"type": "regex", "regex": "[a-z]+"}))
    assert vocabulary.n_vocab is not None
    allowed = mask.allowed(vocabulary.n_vocab)
    assert allowed.shape == (vocabulary.n_vocab,)
    assert allowed.any() and not allowed[-_PADDING:].any()
    longer = mask.masked(np.zeros(vocabulary.n_vocab + 40, dtype=np.float32))  # a row longer than it knew of
    assert np.isinf(longer[-45:]).all() and np.isfinite(longer).sum() == allowed.sum()


def test_a_vocabulary_without_a_length_masks_rows_of_any_longer_length(tokenizer: object) -> None:
    vocabulary = ConstraintVocabulary.from_tokenizer(tokenizer, end_ids=[0], install="x")
    mask = vocabulary.mask_for(Constraint.build({"type": "regex", "regex": "[a-z]+"}))
    size = tokenizer.get_vocab_size()  # type: ignore[attr-defined]
    assert mask.n_vocab == size
    assert np.isfinite(mask.masked(np.zeros(size + 3, dtype=np.float32))).sum() == mask.allowed().sum() > 0


def test_apply_masks_the_logits_in_place_as_masked_does(vocabulary: ConstraintVocabulary) -> None:
    mask = vocabulary.mask_for(Constraint.build({"type": "regex", "regex": "fox|dog"}))
    logits = np.arange(vocabulary.n_vocab or 0, dtype=np.float32)
    expected = mask.masked(logits).copy()
    mask.apply(logits)
    assert np.array_equal(logits, expected)
    assert np.isinf(logits).sum() == len(logits) - mask.allowed().sum() > 0


def test_a_logits_row_shorter_than_the_vocabulary_is_a_plugin_error(vocabulary: ConstraintVocabulary) -> None:
    mask = vocabulary.mask_for(Constraint.build({"type": "regex", "regex": "a"}))
    with pytest.raises(AnyformerError) as caught:
        mask.masked(np.zeros(mask.n_vocab - 1, dtype=np.float32))
    assert caught.value.code is ErrorCode.PLUGIN_ERROR


def test_a_token_the_mask_forbids_is_refused(vocabulary: ConstraintVocabulary, tokenizer: object) -> None:
    mask = vocabulary.mask_for(Constraint.build({"type": "regex", "regex": "yes"}))
    forbidden = int(np.flatnonzero(~mask.allowed())[0])
    with pytest.raises(AnyformerError) as caught:
        mask.consume(forbidden)
    assert caught.value.code is ErrorCode.PLUGIN_ERROR


def test_a_grammar_that_does_not_compile_is_a_bad_request(vocabulary: ConstraintVocabulary) -> None:
    with pytest.raises(AnyformerError) as caught:
        vocabulary.mask_for(Constraint.build({"type": "lark", "lark": "start: undefined_rule"}))
    assert caught.value.code is ErrorCode.BAD_REQUEST


def test_without_llguidance_a_constraint_is_refused_naming_the_install(
    tokenizer: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    vocabulary = ConstraintVocabulary.from_tokenizer(
        tokenizer, n_vocab=300, end_ids=[0], install="pip install 'anyformer-demo[constrained]'"
    )
    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance now raises ImportError
    with pytest.raises(AnyformerError) as caught:
        vocabulary.mask_for(Constraint.build({"type": "regex", "regex": "a"}))
    assert caught.value.code is ErrorCode.BAD_REQUEST
    assert "llguidance" in str(caught.value) and "anyformer-demo[constrained]" in str(caught.value)


def test_a_character_vocabulary_with_a_decoder_llguidance_does_not_read_falls_back_to_token_texts() -> None:
    """A ``Fuse`` decoder (as a character vocabulary has) is not readable from tokenizer.json: each token's text is."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    chars = "abcdefghijklmnopqrstuvwxyz0123456789 -"
    vocab = {"<unk>": 0, **{c: i + 1 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(_END, special=True, normalized=False)])
    end = tok.token_to_id(_END)
    vocabulary = ConstraintVocabulary.from_tokenizer(tok, end_ids=[end], install="x")
    pattern = r"[a-z]{3}-[0-9]{2}"
    for seed in range(3):
        assert re.fullmatch(
            pattern, _walk(vocabulary, tok, Constraint.build({"type": "regex", "regex": pattern}), seed)
        )


def test_masks_computed_ahead_on_an_executor_are_the_masks_computed_in_line(vocabulary: ConstraintVocabulary) -> None:
    from concurrent.futures import ThreadPoolExecutor

    constraint = Constraint.build({"type": "regex", "regex": r"(yes|no) [0-9]{2,4} (fox|dog)"})
    in_line, ahead = vocabulary.mask_for(constraint), vocabulary.mask_for(constraint)
    rng = np.random.default_rng(7)
    with ThreadPoolExecutor(max_workers=1) as executor:
        while not in_line.finished:
            expected = in_line.bitmask().copy()
            assert np.array_equal(ahead.bitmask(), expected)
            token = int(in_line.masked(rng.normal(size=in_line.n_vocab).astype(np.float32)).argmax())
            if token in vocabulary.tokenizer().eos_tokens:
                break
            in_line.consume(token)
            ahead.consume(token)
            ahead.compute_ahead(executor)  # computed while the "model" runs; bitmask() waits for it
            assert ahead.finished == in_line.finished
