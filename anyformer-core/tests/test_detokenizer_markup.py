"""The streamed text of a reply (``anyformer.plugin.IncrementalDetokenizer``): tool-call markup held in a
special token keeps its text, other special tokens leave none."""

from __future__ import annotations

import pytest

pytest.importorskip("tokenizers")


def test_the_incremental_detokenizer_keeps_tool_call_markup_held_in_a_special_token() -> None:
    """Special tokens leave no text in a streamed reply, except tool-call markup: the core reads calls from it."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    from anyformer.plugin import IncrementalDetokenizer

    chars = 'abcdefghijklmnopqrstuvwxyz{}":, '
    tok = Tokenizer(models.BPE(vocab={"<unk>": 0, **{c: i + 1 for i, c in enumerate(chars)}}, merges=[]))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("[TOOL_CALLS]", "<|end|>")])
    ids = [tok.token_to_id("[TOOL_CALLS]"), *tok.encode("{a: b}").ids, tok.token_to_id("<|end|>")]
    stream = IncrementalDetokenizer(tok)
    text = "".join(stream.add(i) for i in ids) + stream.flush()
    assert text == "[TOOL_CALLS]{a: b}"
