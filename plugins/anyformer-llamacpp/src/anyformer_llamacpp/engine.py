"""A GGUF opened with llama.cpp, and the decode loop that streams its replies.

The loop drives ``Llama.eval`` and reads the last logits itself (greedy is an argmax over them; a
temperature draws from a seeded numpy generator), so the per-token work in Python is a few
microseconds over llama-cpp-python's own. The KV cache is kept between calls: a new prompt that
shares a prefix with what is cached re-evaluates only the rest, cut back to where an earlier
evaluation began, so the same messages always give the same logits (greedy repeatability).
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from anyformer import AnyformerError, Chunk, ErrorCode, GenerateOptions, Message, Model, ProgressCallback, ProgressEvent
from anyformer._caps import usable_cpu_count
from anyformer._chat_template import render_chat
from anyformer._gguf_header import check_split_set, read_gguf_header
from anyformer._messages import has_images
from anyformer._store import fetch_files
from anyformer_llamacpp import BACKEND_ID
from anyformer_llamacpp.estimate import context_for, footprint
from anyformer_llamacpp.file_choice import choose_gguf
from anyformer_llamacpp.header_checks import check_architecture_numbers
from anyformer_llamacpp.runtime import gpu_offload_library

#: Defaults for sampling when the temperature is above 0, as llama.cpp's own.
TOP_K = 40
TOP_P = 0.95


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Silence llama.cpp's C-level log lines while loading (``verbose=False`` does not catch them all)."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def pick_threads() -> int:
    """Threads for decoding: every core this process may use.

    Measured on the 2-core machine with SmolLM2-135M: 1 thread ~75 tok/s (llama-cpp-python's
    default of half the cores), 2 threads ~94 tok/s; on the 16-core H200 host 16 threads beat 2
    by 3x. ``ANYFORMER_LLAMACPP_THREADS`` overrides.
    """
    override = os.environ.get("ANYFORMER_LLAMACPP_THREADS")
    if override and override.isdigit() and int(override) > 0:
        return int(override)
    return usable_cpu_count()


class LlamaCppModel:
    """A loaded GGUF: the ``Llama`` object, its chat template, and the KV cache bookkeeping."""

    backend = BACKEND_ID
    task = "text-generation"

    def __init__(self, llama: Any, template: str | None, name: str, context: int, gpu_layers: int) -> None:
        import llama_cpp

        self._llama: Any = llama
        self._lib = llama_cpp
        self._template = template
        self.name = name
        self.context = context
        self.gpu_layers = gpu_layers
        self._vocab = llama._model.vocab
        self._n_vocab = llama.n_vocab()
        self._bos_text = (
            self._piece(llama.token_bos(), special=True).decode("utf-8", "replace") if llama.token_bos() >= 0 else ""
        )
        self._eos_text = (
            self._piece(llama.token_eos(), special=True).decode("utf-8", "replace") if llama.token_eos() >= 0 else ""
        )
        self._pieces: dict[int, bytes] = {}
        # Positions where an evaluation began; the cache is only ever cut back to one of them.
        self._eval_starts: list[int] = []

    # ---- loading --------------------------------------------------------------------------------

    @classmethod
    def open(cls, model: Model, request: Any, progress: ProgressCallback) -> LlamaCppModel:
        """Fetch the chosen GGUF (and shards), validate every header, and load it with llama.cpp."""
        choice = choose_gguf(model)
        if choice is None:
            raise AnyformerError(ErrorCode.NO_BACKEND, f"{model.ref}: no GGUF llama.cpp can load")
        paths = fetch_files(model, [f.name for f in choice.files], progress, backend=BACKEND_ID)
        ordered = [paths[f.name] for f in choice.files]
        progress(ProgressEvent(stage="verify", backend=BACKEND_ID, file=choice.first.name))
        headers = [(path.name, read_gguf_header(path, name=path.name)) for path in ordered]
        if len(headers) > 1:
            check_split_set(headers)
        first = headers[0][1]
        facts = first.summary()
        check_architecture_numbers(choice.first.name, facts)
        context = context_for(facts, request.context)
        budget = request.budget or 0
        plan = footprint(
            facts, choice.size, context=context, budget=budget, gpu_offload=gpu_offload_library() is not None
        )
        template = first.get("tokenizer.chat_template")
        progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=choice.first.name, total=choice.size))
        llama = cls._open_llama(ordered[0], context, plan.gpu_layers, request)
        progress(
            ProgressEvent(stage="load", backend=BACKEND_ID, file=choice.first.name, done=choice.size, total=choice.size)
        )
        return cls(llama, template if isinstance(template, str) else None, choice.first.name, context, plan.gpu_layers)

    @staticmethod
    def _open_llama(path: Path, context: int, gpu_layers: int, request: Any) -> Any:
        from llama_cpp import Llama

        threads = int(request.options.get("threads") or pick_threads())
        try:
            with _quiet_native_stderr():
                return Llama(
                    model_path=str(path),
                    n_ctx=context,
                    n_threads=threads,
                    n_threads_batch=threads,
                    n_gpu_layers=gpu_layers,
                    n_batch=min(512, context),
                    verbose=False,
                )
        except MemoryError as exc:
            raise AnyformerError(
                ErrorCode.OUT_OF_MEMORY, f"{path.name}: out of memory while loading", cause=exc
            ) from exc
        except ValueError as exc:
            message = str(exc)
            if "context" in message.lower():
                raise AnyformerError(
                    ErrorCode.OUT_OF_MEMORY,
                    f"{path.name}: llama.cpp could not allocate a {context}-token context ({message}); "
                    "ask for a shorter context or a smaller model",
                    cause=exc,
                ) from exc
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"{path.name}: llama.cpp could not load it ({message})", cause=exc
            ) from exc

    def dispose(self) -> None:
        """Free the model and its context; a second call does nothing."""
        llama, self._llama = self._llama, None
        if llama is not None:
            llama.close()

    # ---- tokens ---------------------------------------------------------------------------------

    def _piece(self, token: int, *, special: bool = False) -> bytes:
        buffer = ctypes.create_string_buffer(64)
        length = self._lib.llama_token_to_piece(self._llama._model.vocab, token, buffer, 64, 0, special)
        if length < 0:
            buffer = ctypes.create_string_buffer(-length)
            length = self._lib.llama_token_to_piece(self._llama._model.vocab, token, buffer, -length, 0, special)
        return buffer.raw[: max(length, 0)]

    def _text_piece(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._piece(token)
        return piece

    def prompt_tokens(self, messages: list[Message], thinking: bool) -> list[int]:
        """The chat template rendered in the sandbox and tokenized (special tokens parsed)."""
        prompt = render_chat(
            self._template,
            messages,
            add_generation_prompt=True,
            bos_token=self._bos_text,
            eos_token=self._eos_text,
            enable_thinking=thinking,
        )
        # The template writes BOS itself when it wants one; otherwise the vocabulary's rule applies.
        add_special = not (self._bos_text and prompt.startswith(self._bos_text))
        return self._llama.tokenize(prompt.encode("utf-8"), add_bos=add_special, special=True)

    # ---- the KV cache ---------------------------------------------------------------------------

    def _reuse_prefix(self, tokens: list[int]) -> int:
        """How many leading tokens of ``tokens`` the cache already holds, cut back to an evaluation start."""
        llama = self._llama
        cached = llama.input_ids[: llama.n_tokens]
        limit = min(len(cached), len(tokens) - 1)  # the last prompt token is always evaluated: we need its logits
        same = 0
        while same < limit and cached[same] == tokens[same]:
            same += 1
        return max((s for s in self._eval_starts if s <= same), default=0)

    def _eval(self, tokens: list[int]) -> None:
        self._eval_starts.append(self._llama.n_tokens)
        self._llama.eval(tokens)

    def _last_logits(self) -> np.ndarray:
        pointer = self._lib.llama_get_logits_ith(self._llama._ctx.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(self._n_vocab,))

    # ---- generation -----------------------------------------------------------------------------

    def stream(self, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
        """Validate what only this backend knows, then return the token stream."""
        if self._llama is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.name} was disposed")
        if has_images(messages):
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"{self.name} reads text only: the repo has no multimodal projector (mmproj) for image blocks",
            )
        tokens = self.prompt_tokens(messages, options.thinking)
        if len(tokens) >= self.context:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"the prompt is {len(tokens)} tokens and the context is {self.context}; load with a larger context",
            )
        return self._decode(tokens, options)

    def _choose(self, logits: np.ndarray, options: GenerateOptions, rng: np.random.Generator | None) -> int:
        if rng is None:
            return int(logits.argmax())
        top_k = int(options.extra.get("top_k", TOP_K))
        top_p = float(options.extra.get("top_p", TOP_P))
        k = min(max(top_k, 1), logits.shape[0])
        candidates = np.argpartition(logits, -k)[-k:]
        scaled = logits[candidates].astype(np.float64) / options.temperature
        order = np.argsort(-scaled)
        candidates, scaled = candidates[order], scaled[order]
        weights = np.exp(scaled - scaled[0])
        weights /= weights.sum()
        keep = int(np.searchsorted(np.cumsum(weights), top_p) + 1)
        weights = weights[:keep] / weights[:keep].sum()
        return int(candidates[rng.choice(keep, p=weights)])

    def _decode(self, tokens: list[int], options: GenerateOptions) -> Iterator[Chunk]:
        llama = self._llama
        rng = np.random.default_rng(options.seed) if options.temperature > 0 else None
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        is_eog = self._lib.llama_vocab_is_eog
        vocab = self._vocab
        cancel = options.cancel
        room = self.context - len(tokens)
        budget = min(options.max_new_tokens, room)

        prefix = self._reuse_prefix(tokens)
        llama.n_tokens = prefix
        del self._eval_starts[
            next((i for i, s in enumerate(self._eval_starts) if s >= prefix), len(self._eval_starts)) :
        ]
        self._eval(tokens[prefix:])
        count = 0
        while not cancel.is_set():
            token = self._choose(self._last_logits(), options, rng)
            if is_eog(vocab, token):
                yield Chunk(delta=decoder.decode(b"", final=True), tokens=count, finish_reason="stop")
                return
            count += 1
            yield Chunk(delta=decoder.decode(self._text_piece(token)), tokens=count)
            if count >= budget:
                tail = decoder.decode(b"", final=True)
                yield Chunk(delta=tail, tokens=count, finish_reason="length")
                return
            if cancel.is_set():
                break
            self._eval([token])
        yield Chunk(delta="", tokens=count, finish_reason="cancelled")
