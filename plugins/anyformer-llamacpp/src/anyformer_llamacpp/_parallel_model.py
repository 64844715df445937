"""A GGUF loaded to serve several streams at once (the ``parallel`` load option), batched by ``_batch``.

It is the one-stream :class:`~anyformer_llamacpp.engine.LlamaCppModel` for everything but decoding:
loading and validation, the chat template, tokenizing raw and fill-in-the-middle prompts, token
choice and log-probabilities. The ``Llama`` object it opens keeps only a token-sized context of its
own (the tokenizer needs none); the :class:`~anyformer_llamacpp._batch.BatchEngine` holds the real
one, with ``parallel`` sequences of ``context`` tokens each. Its handle declares ``parallel`` so the
core lets that many streams be open at once. Models with a multimodal projector and embedding
models are loaded one-stream (``plugin.load`` decides).
"""

from __future__ import annotations

import codecs
import dataclasses
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from anyformer.plugin import Chunk, GenerateOptions, GGUFCandidate, Model, ProgressCallback, Request, TokenLogprob
from anyformer_llamacpp._batch import BatchEngine, PromptScores, Ticket
from anyformer_llamacpp.engine import LlamaCppModel, Segments
from anyformer_llamacpp.runtime import gpu_offload_library
from anyformer_llamacpp.sampling import Sampler
from anyformer_llamacpp.vision import Chunks, ImageChunk

#: The context the ``Llama`` object itself is made with: the batched engine has the real one.
_TOKENIZER_CONTEXT = 64
#: How often a stream waiting for its next token looks at its cancel event and at dispose.
_POLL_SECONDS = 0.05
#: Marks that no reply is held back while a stream gathers the tokens waiting for it.
_NOTHING = object()


class ParallelLlamaCppModel(LlamaCppModel):
    """A loaded GGUF whose streams (up to ``parallel``) share one batched context."""

    _engine: BatchEngine | None = None

    @classmethod
    def open_parallel(
        cls, model: Model, request: Request, progress: ProgressCallback, parallel: int, choice: GGUFCandidate
    ) -> ParallelLlamaCppModel:
        """Load ``choice`` as the one-stream model does, then start the scheduler over ``parallel`` sequences."""
        loaded = cls.open(model, request, progress, choice)
        assert isinstance(loaded, ParallelLlamaCppModel)
        try:
            loaded._engine = BatchEngine(
                loaded._llama,
                parallel=parallel,
                context=loaded.context,
                score=loaded._token_logprob,
                is_end=lambda token: bool(loaded._lib.llama_vocab_is_eog(loaded._vocab, token)),
                # No GPU library and no layer offloaded: every product runs on the CPU kernels (with a GPU
                # build, llama.cpp may send a large batch's products to the GPU even with no layer there).
                on_cpu=loaded.gpu_layers == 0 and gpu_offload_library() is None,
            )
        except BaseException:
            loaded.dispose()
            raise
        # How many streams it serves at once: the core lets that many be open.
        loaded.features = dataclasses.replace(loaded.features, parallel=parallel)
        return loaded

    @staticmethod
    def _open_llama(
        path: Path,
        context: int,
        gpu_layers: int,
        request: Any,
        *,
        embedding: bool = False,
        mean: bool = True,
        tensor_split: list[float] | None = None,
    ) -> Any:
        # The one-stream open, with a token-sized context: the batched engine makes the context that decodes.
        llama = LlamaCppModel._open_llama(
            path,
            min(context, _TOKENIZER_CONTEXT),
            gpu_layers,
            request,
            embedding=embedding,
            mean=mean,
            tensor_split=tensor_split,
        )
        # What the prompt builders read as the batch size (infill cuts its prefix by it): the one-stream value.
        llama.n_batch = min(512, context)
        return llama

    def _free(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()  # its context points into the model: freed first
        super()._free()

    # ---- generation ---------------------------------------------------------------------------------

    def _decode(
        self,
        segments: Segments,
        options: GenerateOptions,
        chunks: Chunks | None = None,
        marks: list[int] | None = None,
        sampler: Sampler | None = None,
    ) -> Iterator[Chunk]:
        if chunks is not None:  # no projector is loaded in parallel mode, so no prompt has images
            chunks.close()
        # Cut where each message's text begins and where each segment ends, as the one-stream engine cuts
        # a prompt: a slot holding the same system prompt keeps it up to the new question (see _slots).
        cuts = list(marks or [])
        prompt: list[int] = []
        for segment in segments:
            assert not isinstance(segment, ImageChunk)
            prompt.extend(segment)
            cuts.append(len(prompt))
        with self._using():
            engine = self._engine
            assert engine is not None
            budget = min(options.max_new_tokens, self.context - len(prompt))
            ticket = engine.submit(prompt, options, budget, cuts, sampler)
            try:
                yield from self._replies(ticket, len(prompt))
            finally:
                if not ticket.abandoned.is_set():
                    ticket.abandoned.set()
                    engine.wake()

    def _replies(self, ticket: Ticket, prompt: int) -> Iterator[Chunk]:
        """The stream's chunks, from the tokens the scheduler sends back.

        The tokens already waiting when the stream wakes go out as one chunk: every chunk wakes a
        thread or two on its way to the client (a pipe frame, the server's event loop), and when the
        reader lags (the cores busy with the decode threads) carrying them together spends less of
        the CPU the decode needs. Alone on a quiet machine a stream finds one token at a time.
        """
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        cancel = ticket.options.cancel
        count = 0
        held: Any = _NOTHING  # a reply taken while gathering tokens, handled next
        while True:
            if cancel.is_set() or self._closing:
                # The scheduler may have run ahead of the reader: what it queued is dropped, and it ends
                # the ticket at its next step.
                if not ticket.abandoned.is_set():
                    ticket.abandoned.set()
                    assert self._engine is not None
                    self._engine.wake()
                yield Chunk(delta="", tokens=count, finish_reason="cancelled", prompt_tokens=prompt)
                return
            if held is not _NOTHING:
                reply, held = held, _NOTHING
            else:
                try:
                    reply = ticket.replies.get(timeout=_POLL_SECONDS)
                except queue.Empty:
                    continue
            if isinstance(reply, tuple):
                pieces: list[str] = []
                entries: list[TokenLogprob] = []
                while True:
                    token, entry = reply
                    count += 1
                    pieces.append(decoder.decode(self._text_piece(token)))
                    if entry is not None:
                        entries.append(entry)
                    try:
                        reply = ticket.replies.get_nowait()
                    except queue.Empty:
                        break
                    if not isinstance(reply, tuple):
                        held = reply
                        break
                self.last_prompt_evaluated = ticket.evaluated
                yield Chunk(delta="".join(pieces), tokens=count, prompt_tokens=prompt, logprobs=tuple(entries))
                continue
            if isinstance(reply, PromptScores):
                # The first token has no entry (nothing before it), as OpenAI's echo shows it; a BOS the
                # tokenizer added is not in the prompt's text and gets none at all (the one-stream rule).
                tokens = ticket.prompt
                first = (
                    [] if tokens[0] == self._llama.token_bos() else [TokenLogprob(self._token_text(tokens[0]), None)]
                )
                yield Chunk(tokens=0, prompt_tokens=prompt, prompt_logprobs=(*first, *reply.entries))
                continue
            if isinstance(reply, BaseException):
                raise reply
            self.last_prompt_evaluated = ticket.evaluated
            tail = decoder.decode(b"", final=True) if reply != "cancelled" else ""
            yield Chunk(delta=tail, tokens=count, finish_reason=reply, prompt_tokens=prompt)
            return
