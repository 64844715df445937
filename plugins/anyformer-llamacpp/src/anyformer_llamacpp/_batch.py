"""Continuous batching: one llama.cpp context, N sequences, one ``llama_decode`` per step for all of them.

A scheduler thread owns the context. Each step it

1. admits waiting prompts to free slots (``_slots.choose_slot``: the slot whose cache holds the
   longest part of the prompt, up to a cut of both prompts' plans), cutting that slot's cache back
   to the prefix it keeps;
2. drops the streams whose callers cancelled or left (their slot's cache is kept for reuse);
3. builds one ``llama_batch`` holding the last token of every decoding sequence (each with its own
   ``seq_id`` and position) and the prompt blocks of the sequences still reading their prompt, cut
   where the one-stream engine cuts them (``prompt_blocks``: the block grid and where each
   message's text begins), at most :data:`PREFILL_TOKENS_PER_STEP` positions while others decode:
   a long prompt is read over several steps instead of stalling every other stream, and each of
   those steps still advances every decoding stream by a token;
4. runs one ``llama_decode`` of it, picks each decoding sequence's next token, and records each
   block's end in its slot (the cache's cuts stay the plan's).

Prompt blocks share the step's decode only where a row's numbers do not depend on the batch around
it (:func:`merges_prompts`): on llama.cpp's CPU kernels with flash attention, where a block beside
other streams' tokens came out bitwise equal to the block alone, and every decode token beside a
block equal to the token without it. Elsewhere (flash attention off, a GPU) each block is a
``llama_decode`` of its own, so a cached block is always the one a fresh evaluation computes.

Tokens go back to each stream's queue as ids (with a log-probability entry when asked for); the
stream's own thread turns them into text. The context uses ``kv_unified = false``: each sequence
has a KV region of its own, filled from its own cell 0, so a sequence's attention sums run over the
same cells in the same order whether it decodes alone or beside others.
"""

from __future__ import annotations

import ctypes
import dataclasses
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import llama_cpp
import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode, GenerateOptions, TokenLogprob
from anyformer_llamacpp._slots import Slot, choose_slot
from anyformer_llamacpp.prompt_blocks import BLOCK, batches, plan
from anyformer_llamacpp.sampling import Sampler

#: Prompt tokens one step reads while other sequences decode (a multiple of the block): a long
#: prompt takes several steps, and each of them still advances every decoding stream by one token.
PREFILL_TOKENS_PER_STEP = 4 * BLOCK
#: How long an idle scheduler sleeps before it looks again (a submit or a close wakes it at once).
_IDLE_SECONDS = 1.0

#: The log-probability entry of a chosen token: ``(logits, token, top) -> TokenLogprob``.
Scorer = Callable[[np.ndarray, int, int], TokenLogprob]


@dataclasses.dataclass(frozen=True)
class PromptScores:
    """The reply that carries a scored prompt's entries (each token after the first, under the ones before it)."""

    entries: tuple[TokenLogprob, ...]


@dataclasses.dataclass(eq=False)
class Ticket:
    """One stream's request to the scheduler, and the queue its tokens come back on.

    The queue carries ``(token, logprob entry or None)`` pairs, then one finish reason (``stop``,
    ``length``, ``cancelled``) or an :class:`AnyformerError`.
    """

    prompt: list[int]
    options: GenerateOptions
    budget: int
    #: Where the prompt's batches end (``prompt_blocks.plan``: the block grid, the marks, the end).
    ends: list[int]
    replies: queue.SimpleQueue[Any] = dataclasses.field(default_factory=queue.SimpleQueue)
    #: Set by the stream when its caller is done with it (closed, cancelled, disposed).
    abandoned: threading.Event = dataclasses.field(default_factory=threading.Event)
    #: Prompt positions evaluated (the rest came from the slot's cache); known once the prompt is read.
    evaluated: int = 0
    #: The stream's token choice (its options, seed, penalties' history and constraint).
    sampler: Sampler | None = None
    # Scheduler-side state.
    slot: Slot | None = None
    position: int = 0  # the next prompt position to read
    generated: int = 0
    next_token: int | None = None  # the token to feed at the next step, once the prompt is read
    logits_at: int = -1  # its row in the last decode's batch
    #: ``generate(prompt_logprobs=True)``: every prompt position's logits are read, and the cache is not reused.
    score_prompt: bool = False
    prompt_entries: list[TokenLogprob] = dataclasses.field(default_factory=list)

    def stop_wanted(self) -> bool:
        """The caller cancelled or left."""
        return self.abandoned.is_set() or self.options.cancel.is_set()


def merges_prompts(*, on_cpu: bool, flash_attention: bool) -> bool:
    """Whether prompt blocks go into the step's decode beside the other streams' tokens.

    Only where a row's numbers were measured not to depend on the batch around it: llama.cpp's CPU
    kernels with flash attention (each row's quantised products and its attention run alone;
    ``bench/bench_merge.py``: 128 of 128 block shapes bitwise equal, merged or apart). With flash
    attention off the attention products take another kernel for some batch shapes (4 of 128 differ,
    by up to 11 in a logit), and a GPU's kernels change with the batch shape: there each block is
    decoded alone, so a cached block is what a fresh evaluation computes.
    """
    return on_cpu and flash_attention


def _seq_id(ticket: Ticket) -> int:
    return ticket.slot.seq_id if ticket.slot is not None else 0


class BatchEngine:
    """The scheduler and the context it owns (see the module docstring)."""

    def __init__(
        self,
        llama: Any,
        *,
        parallel: int,
        context: int,
        score: Scorer,
        is_end: Callable[[int], bool],
        on_cpu: bool = False,
    ) -> None:
        """``on_cpu``: every layer and every product runs on llama.cpp's CPU kernels (no GPU build, nothing
        offloaded), which with flash attention lets prompt blocks share the step's decode (:func:`merges_prompts`)."""
        self._lib = llama_cpp
        self._n_vocab = llama.n_vocab()
        self._score = score
        self._is_end = is_end
        params = llama.context_params
        # A copy of the load's settings (threads, batch, offload), with one KV region per sequence.
        params = type(params).from_buffer_copy(params)
        params.n_seq_max = parallel
        params.kv_unified = False
        params.n_ctx = context * parallel  # n_ctx is shared out: each sequence gets n_ctx / n_seq_max
        # A step holds every decoding stream's token and a prompt's share; with nobody decoding, a
        # prompt is read up to 512 positions a step (llama.cpp's default batch).
        params.n_batch = max(512, PREFILL_TOKENS_PER_STEP + parallel)
        params.n_ubatch = params.n_batch
        self._n_batch = int(params.n_batch)
        self.merge_prompts = merges_prompts(on_cpu=on_cpu, flash_attention=params.flash_attn_type == 1)
        self._ctx = llama_cpp.llama_init_from_model(llama._model.model, params)
        if not self._ctx:
            raise AnyformerError(
                ErrorCode.OUT_OF_MEMORY,
                f"llama.cpp could not make a context of {parallel} sequences of {context} tokens; "
                "load with a smaller parallel or context",
            )
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(self._n_batch, 0, 1)
        self.slots = [Slot(seq_id) for seq_id in range(parallel)]
        self._waiting: list[Ticket] = []
        self._active: list[Ticket] = []
        self._changed = threading.Condition()
        self._closing = False
        self._steps = 0
        self._thread = threading.Thread(target=self._run, name="anyformer-llamacpp-batch", daemon=True)
        self._thread.start()

    # ---- what streams call ------------------------------------------------------------------------

    def submit(
        self,
        prompt: list[int],
        options: GenerateOptions,
        budget: int,
        marks: Sequence[int] = (),
        sampler: Sampler | None = None,
    ) -> Ticket:
        """Queue a prompt; its tokens come back on the ticket's queue, chosen by ``sampler``
        (by default one made from ``options``).

        ``marks`` are where each message's text begins: the prompt is cut there too, as the
        one-stream engine cuts it, so a slot holding the same system prompt keeps it up to the new
        question.
        """
        chooser = sampler if sampler is not None else Sampler(options, self._n_vocab)
        ticket = Ticket(prompt=prompt, options=options, budget=budget, ends=plan(len(prompt), marks), sampler=chooser)
        ticket.score_prompt = bool(options.prompt_logprobs) and options.logprobs is not None
        with self._changed:
            if self._closing:
                raise AnyformerError(ErrorCode.BAD_REQUEST, "the model was disposed")
            self._waiting.append(ticket)
            self._changed.notify()
        return ticket

    def wake(self) -> None:
        """Have the scheduler look at the streams now (one was cancelled)."""
        with self._changed:
            self._changed.notify()

    def close(self) -> None:
        """Stop the scheduler (streams still queued end with ``cancelled``) and free the context."""
        with self._changed:
            self._closing = True
            self._changed.notify()
        self._thread.join()
        for ticket in self._waiting + self._active:
            ticket.replies.put("cancelled")
        self._waiting, self._active = [], []
        if self._batch is not None:
            self._lib.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            self._lib.llama_free(self._ctx)
            self._ctx = None

    # ---- the scheduler ------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._closing and not self._waiting and not self._active:
                    self._changed.wait(_IDLE_SECONDS)
                if self._closing:
                    return
                self._admit()
            self._drop_abandoned()
            if not self._active:
                continue
            try:
                self._step()
            except Exception as exc:  # a failing step ends the streams in it, with the cause named
                error = (
                    exc
                    if isinstance(exc, AnyformerError)
                    else AnyformerError(ErrorCode.PLUGIN_ERROR, f"llamacpp: a batched decode step failed: {exc}")
                )
                for ticket in list(self._active):
                    self._forget(ticket.slot)
                    self._finish(ticket, error)

    def _admit(self) -> None:
        """Give waiting prompts the free slots (called with the condition held)."""
        while self._waiting:
            ticket = self._waiting[0]
            if ticket.stop_wanted():
                self._waiting.pop(0)
                ticket.replies.put("cancelled")
                continue
            chosen = choose_slot(self.slots, ticket.prompt, ticket.ends)
            if chosen is None:
                return
            slot, prefix = chosen
            if ticket.score_prompt:
                prefix = 0  # the reused positions' logits are gone: a scored prompt is evaluated whole
            self._waiting.pop(0)
            self._lib.llama_memory_seq_rm(self._memory, slot.seq_id, prefix, -1)
            slot.cut_back(prefix)
            slot.busy = True
            slot.last_used = self._steps
            ticket.slot = slot
            ticket.position = prefix
            self._active.append(ticket)

    def _drop_abandoned(self) -> None:
        for ticket in list(self._active):
            if ticket.stop_wanted():
                self._finish(ticket, "cancelled")

    def _forget(self, slot: Slot | None) -> None:
        """Empty a slot's cache: after a failed step its bookkeeping may name cells that were never filled."""
        if slot is not None:
            self._lib.llama_memory_seq_rm(self._memory, slot.seq_id, -1, -1)
            slot.cut_back(0)

    def _finish(self, ticket: Ticket, end: str | AnyformerError) -> None:
        """End a stream: its last reply, and its slot free again (its cache kept for the next prompt)."""
        if ticket in self._active:
            self._active.remove(ticket)
        if ticket.slot is not None:
            ticket.slot.busy = False
        ticket.replies.put(end)

    def _add(self, token: int, position: int, seq_id: int, logits: bool) -> int:
        batch = self._batch
        index = int(batch.n_tokens)
        batch.token[index] = token
        batch.pos[index] = position
        batch.n_seq_id[index] = 1
        batch.seq_id[index][0] = seq_id
        batch.logits[index] = logits
        batch.n_tokens = index + 1
        return index

    def _step(self) -> None:
        """One step: every decoding stream's next token and a share of the prompts' blocks (the module docstring)."""
        decoding = [ticket for ticket in self._active if ticket.next_token is not None]
        reading = [ticket for ticket in self._active if ticket.next_token is None]
        blocks = self._blocks(reading, PREFILL_TOKENS_PER_STEP if decoding else self._n_batch)
        if self.merge_prompts:
            self._batch.n_tokens = 0
            rows: dict[int, int] = {}  # each block's first row, by the block's id
            # In ascending sequence order: with a KV region per sequence, llama.cpp computes a batch whose
            # sequences come out of order ~20 % slower (measured on SmolLM2 with 4 streams, 1 thread).
            for ticket in sorted((*decoding, *reading), key=_seq_id):
                if ticket.next_token is not None:
                    self._add_next(ticket)
                for block in blocks:
                    if block[0] is ticket:
                        rows[id(block)] = self._add_block(*block)
            if self._batch.n_tokens:
                self._decode()
            for ticket in decoding:
                self._pick(ticket)
            for block in blocks:
                self._absorb(*block, rows[id(block)])
        else:
            if decoding:
                self._batch.n_tokens = 0
                for ticket in sorted(decoding, key=_seq_id):
                    self._add_next(ticket)
                self._decode()
                for ticket in decoding:
                    self._pick(ticket)  # before the next decode: it overwrites the logits
            for block in blocks:
                if block[0].stop_wanted():  # a cancel stops a long prompt within a block
                    continue
                self._batch.n_tokens = 0
                row = self._add_block(*block)
                self._decode()
                self._absorb(*block, row)
        self._steps += 1

    def _blocks(self, reading: list[Ticket], room: int) -> list[tuple[Ticket, int, int]]:
        """The prompt blocks this step reads, as ``(ticket, first, stop)``: whole blocks of the plan, at most ``room``
        positions in all (a prompt's blocks in order; the next prompt's when the first is read or its block is too big).
        """
        chosen: list[tuple[Ticket, int, int]] = []
        for ticket in reading:
            if ticket.stop_wanted():
                continue
            for first, stop in batches(ticket.ends, ticket.position, len(ticket.prompt)):
                if stop - first > room:
                    break
                chosen.append((ticket, first, stop))
                room -= stop - first
            if room < BLOCK:
                break
        return chosen

    def _add_next(self, ticket: Ticket) -> None:
        """Put a decoding stream's next token in the batch, its logits wanted."""
        slot, token = ticket.slot, ticket.next_token
        assert slot is not None and token is not None
        ticket.logits_at = self._add(token, len(slot.tokens), slot.seq_id, True)
        slot.tokens.append(token)
        ticket.next_token = None

    def _add_block(self, ticket: Ticket, first: int, stop: int) -> int:
        """Put a prompt block in the batch; returns the row of its first position."""
        slot = ticket.slot
        assert slot is not None
        prompt = ticket.prompt
        row = int(self._batch.n_tokens)
        for position in range(first, stop):
            wanted = ticket.score_prompt or position == len(prompt) - 1
            self._add(prompt[position], position, slot.seq_id, wanted)
        return row

    def _decode(self) -> None:
        status = self._lib.llama_decode(self._ctx, self._batch)
        if status != 0:
            raise AnyformerError(
                ErrorCode.OUT_OF_MEMORY if status == 1 else ErrorCode.PLUGIN_ERROR,
                f"llama.cpp could not decode a batch of {self._batch.n_tokens} tokens (status {status})",
            )

    def _absorb(self, ticket: Ticket, first: int, stop: int, row: int) -> None:
        """Take in a decoded prompt block whose first position was batch row ``row``: its scores, the slot's record
        of it (the plan's cut), and the first reply token once the prompt is read."""
        slot = ticket.slot
        assert slot is not None
        prompt = ticket.prompt
        if ticket.score_prompt:
            top = ticket.options.logprobs or 0
            for offset, position in enumerate(range(first, min(stop, len(prompt) - 1))):
                ticket.prompt_entries.append(self._score(self._logits(row + offset), prompt[position + 1], top))
        slot.tokens.extend(prompt[first:stop])
        slot.ends.append(stop)
        ticket.evaluated += stop - first
        ticket.position = stop
        if stop == len(prompt):
            if ticket.score_prompt:
                ticket.replies.put(PromptScores(tuple(ticket.prompt_entries)))
                if ticket.budget <= 0:  # scoring alone (max_new_tokens=0)
                    self._finish(ticket, "length")
                    return
            ticket.logits_at = row + stop - first - 1
            self._pick(ticket)

    def _logits(self, row: int) -> np.ndarray:
        """The logits of row ``row`` of the last decode's batch (valid until the next decode)."""
        pointer = self._lib.llama_get_logits_ith(self._ctx, row)
        return np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self._n_vocab,))

    def _pick(self, ticket: Ticket) -> None:
        """Choose a sequence's next token from its logits and send it to the stream."""
        logits = self._logits(ticket.logits_at)
        options = ticket.options
        sampler = ticket.sampler
        assert sampler is not None
        try:
            token = sampler.choose(logits)
            if not self._is_end(token):
                sampler.accept(token)
            entry = None if options.logprobs is None else self._score(logits, token, options.logprobs)
        except AnyformerError as exc:  # a constraint that broke: this stream ends, the others go on
            self._finish(ticket, exc)
            return
        except Exception as exc:  # this stream's options or numbers: it ends alone, the batch goes on
            self._finish(ticket, AnyformerError(ErrorCode.PLUGIN_ERROR, f"llamacpp: choosing a token failed: {exc}"))
            return
        if self._is_end(token):
            self._finish(ticket, "stop")
            return
        ticket.generated += 1
        ticket.replies.put((token, entry))
        if sampler.finished:
            self._finish(ticket, "stop")
            return
        if ticket.generated >= ticket.budget:
            self._finish(ticket, "length")
            return
        ticket.next_token = token
