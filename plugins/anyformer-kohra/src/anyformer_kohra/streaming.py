"""From denoising states to the contract's chunks: only settled text is streamed, so none is taken back.

MDLM: a token becomes part of the streamed text when it and every token before it are final
(unmasked; an unmasked token never changes), so each step streams the newly final prefix in
reading order, and ``tokens`` counts every final token. BD3LM: text arrives a finished block at
a time. Every step's chunk also carries ``preview``, the whole answer with its masks, for display. An
end token in the streamed prefix ends the answer (``stop``) without waiting for the rest. Cancel
is checked before every step, which makes at most one model call.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from anyformer.plugin import Chunk, FinishReason, GenerateOptions
from anyformer_kohra.chat_prompt import visible_reply
from anyformer_kohra.options import DiffusionOptions
from anyformer_kohra.sampler import SamplerState
from anyformer_kohra.steps import DiffusionStep
from anyformer_kohra.text_codec import TextCodec


def settled_prefix(state: SamplerState, mask_id: int, blocks: bool) -> int:
    """How many leading answer tokens are settled: in finished blocks, or final with all before them."""
    if blocks:
        return state.settled
    masked = np.flatnonzero(state.ids == mask_id)
    return int(masked[0]) if masked.size else len(state.ids)


def first_stop(ids: np.ndarray, start: int, end: int, stop_ids: frozenset[int]) -> int | None:
    """The position of the first end token in ``ids[start:end]``, or None."""
    for position in range(start, end):
        if int(ids[position]) in stop_ids:
            return position
    return None


#: How a still-masked position shows in a preview: one compact glyph per token.
PREVIEW_MASK = "\u2591"


def preview_text(ids: np.ndarray, codec: TextCodec) -> str:
    """The answer for display: masked positions as :data:`PREVIEW_MASK`, cut at the first final end token."""
    ends = [i for i, token in enumerate(ids.tolist()) if token in codec.stop_ids]
    upto = ends[0] if ends else len(ids)
    return codec.decode_with_masks(ids[:upto].tolist(), mask_text=PREVIEW_MASK)


def stream_states(
    states: Iterator[SamplerState],
    codec: TextCodec,
    options: GenerateOptions,
    diffusion: DiffusionOptions,
    *,
    prompt_tokens: int,
    blocks: bool,
) -> Iterator[Chunk]:
    """Turn sampler states into chunks; close ``states`` however the stream ends."""
    shown = ""
    tokens = 0
    scanned = 0
    try:
        yield Chunk(tokens=0, prompt_tokens=prompt_tokens)
        while True:
            if options.cancel.is_set():
                yield Chunk(tokens=tokens, finish_reason=FinishReason.CANCELLED.value)
                return
            state = next(states, None)
            if state is None:
                break
            if diffusion.on_step is not None:
                diffusion.on_step(
                    DiffusionStep(
                        text=codec.decode_with_masks(state.ids.tolist()),
                        step=state.step,
                        masked=int(np.count_nonzero(state.ids == codec.mask_id)),
                        block=state.block,
                        model_calls=state.model_calls,
                    )
                )
            prefix = settled_prefix(state, codec.mask_id, blocks)
            # Settled tokens never change, so only the newly settled ones are scanned and decoding
            # waits until there are some: a long answer costs no quadratic work per step.
            stop = first_stop(state.ids, scanned, prefix, codec.stop_ids)
            final_count = prefix if blocks else int(np.count_nonzero(state.ids != codec.mask_id))
            tokens = max(tokens, min(final_count, options.max_new_tokens))
            # All settled: the last chunk, with nothing held back (the core ends the stream when
            # tokens reach max_new_tokens, so the tail is flushed here, not after).
            complete = stop is not None or prefix == len(state.ids)
            delta = ""
            if prefix > scanned or complete:
                end = prefix if stop is None else stop
                text = visible_reply(codec.decode(state.ids[:end].tolist()), final=complete)
                delta = text[len(shown) :] if text.startswith(shown) else ""
                shown += delta
            scanned = max(scanned, prefix)
            if complete:
                finish = FinishReason.STOP if stop is not None else FinishReason.LENGTH
                yield Chunk(delta=delta, tokens=tokens, finish_reason=finish.value)
                return
            # Every step also carries the whole answer as it stands, masks shown, for display
            # (the chat page of `anyformer serve` shows the text emerging from it).
            yield Chunk(delta=delta, tokens=tokens, preview=preview_text(state.ids, codec))
        # The sampler always ends with every position final, so this is reached only for an empty answer.
        yield Chunk(tokens=tokens, finish_reason=FinishReason.LENGTH.value)
    finally:
        close = getattr(states, "close", None)
        if close is not None:
            close()
