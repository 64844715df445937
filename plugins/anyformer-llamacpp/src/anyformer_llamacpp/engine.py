"""A GGUF opened with llama.cpp, and the decode loop that streams its replies.

The loop drives ``Llama.eval`` and reads the last logits itself (greedy is an argmax over them; a
temperature draws from a seeded numpy generator), so the per-token work in Python is a few
microseconds over llama-cpp-python's own. The KV cache is kept between calls: a new prompt that
shares a prefix with what is cached re-evaluates only the rest, cut back to where an earlier
evaluation began, so the same messages always give the same logits (greedy repeatability).

With a projector (``mmproj``) in the repo, image blocks go through llama.cpp's multimodal path
(``vision.py``): the prompt becomes token lists and image chunks, the images are decoded into the
KV cache by libmtmd, and the same loop continues. The positions an image fills are recorded as
``IMAGE`` (-1, never a token id) in the cached ids, and a prompt's reuse of the cache stops at its
first image, so a cached image is never mistaken for another or for text.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# llama_cpp before numpy: with numpy 2.5 imported first, a CUDA build's ggml crashed at context
# creation on the H200 machine (numpy's bundled runtime loaded ahead of ggml's). This module is
# imported only by ``load``, after the user's own imports, so it cannot always win the race; the
# import here is what a fresh process (the CLI, a worker) gets.
import llama_cpp
import numpy as np

from anyformer import AnyformerError, Chunk, ErrorCode, GenerateOptions, Message, Model, ProgressCallback, ProgressEvent
from anyformer.plugin import check_split_set, fetch_files, has_images, read_gguf_header, render_chat, usable_cpu_count
from anyformer_llamacpp import BACKEND_ID
from anyformer_llamacpp.estimate import context_for, footprint
from anyformer_llamacpp.file_choice import choose_gguf
from anyformer_llamacpp.header_checks import check_architecture_numbers, check_vocabulary
from anyformer_llamacpp.runtime import gpu_offload_library
from anyformer_llamacpp.vision import Chunks, ImageChunk, Projector, find_projector

#: The task that loads a GGUF in llama.cpp's embedding mode: ``run(texts)`` returns pooled vectors.
EMBEDDING_TASK = "feature-extraction"
#: Defaults for sampling when the temperature is above 0, as llama.cpp's own.
TOP_K = 40
TOP_P = 0.95

#: What the cached token ids hold where an image was decoded: no token has this id.
IMAGE = -1

#: A prompt: token lists and images, in order.
Segments = list[list[int] | ImageChunk]


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
    """A loaded GGUF: the ``Llama`` object, its chat template, and the KV cache bookkeeping.

    Loaded for ``feature-extraction`` it is an embedding model instead: ``run`` embeds texts and
    ``generate`` is refused.
    """

    backend = BACKEND_ID
    #: The multimodal projector that reads image blocks, when the repo has one (set by ``open``).
    _projector: Projector | None = None
    #: Why image blocks are refused when there is no projector to read them.
    _no_images = "the repo has no multimodal projector (mmproj) for image blocks"

    def __init__(
        self,
        llama: Any,
        template: str | None,
        name: str,
        context: int,
        gpu_layers: int,
        task: str = "text-generation",
    ) -> None:

        self.task = task
        self._llama: Any = llama
        self._lib = llama_cpp
        self._template = template
        self.name = name
        self.context = context
        self.gpu_layers = gpu_layers
        self._vocab = llama._model.vocab
        self._n_vocab = llama.n_vocab()
        self._logits_address: int | None = None
        self._logits_view: np.ndarray = np.empty(0, dtype=np.float32)
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
        check_vocabulary(choice.first.name, first.kv.get("tokenizer.ggml.tokens"))  # undecoded
        context = context_for(facts, request.context)
        budget = request.budget or 0
        plan = footprint(
            facts, choice.size, context=context, budget=budget, gpu_offload=gpu_offload_library() is not None
        )
        template = first.get("tokenizer.chat_template")
        task = EMBEDDING_TASK if (request.task or model.task) == EMBEDDING_TASK else "text-generation"
        # A model with its own pooling rule (an embedding GGUF) keeps it; a chat model's vectors are averaged.
        pooled = first.arch_value("pooling_type") is not None
        embedding = task == EMBEDDING_TASK
        mmproj = None if embedding else find_projector(model, facts, progress)
        progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=choice.first.name, total=choice.size))
        llama = cls._open_llama(ordered[0], context, plan.gpu_layers, request, embedding=embedding, mean=not pooled)
        projector = None
        if mmproj is not None and mmproj.path is not None:
            try:
                with _quiet_native_stderr():
                    projector = Projector.open(
                        mmproj.path, llama._model.model, threads=llama.n_threads, use_gpu=plan.gpu_layers > 0
                    )
            except BaseException:
                llama.close()
                raise
        progress(
            ProgressEvent(stage="load", backend=BACKEND_ID, file=choice.first.name, done=choice.size, total=choice.size)
        )
        chat_template = template if isinstance(template, str) else None
        loaded = cls(llama, chat_template, choice.first.name, context, plan.gpu_layers, task)
        loaded._projector = projector
        if mmproj is not None and mmproj.note:
            loaded._no_images = mmproj.note
        return loaded

    @staticmethod
    def _open_llama(
        path: Path, context: int, gpu_layers: int, request: Any, *, embedding: bool = False, mean: bool = True
    ) -> Any:
        from llama_cpp import Llama

        threads = int(request.options.get("threads") or pick_threads())
        extra: dict[str, Any] = {}
        if embedding:
            extra["embedding"] = True
            if mean:
                extra["pooling_type"] = llama_cpp.LLAMA_POOLING_TYPE_MEAN
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
                    **extra,
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
        projector, self._projector = self._projector, None
        if projector is not None:
            projector.close()  # it points into the language model: freed first
        llama, self._llama = self._llama, None
        if llama is not None:
            llama.close()

    # ---- embeddings -----------------------------------------------------------------------------

    def run(self, input: str | list[str], *, normalize: bool = True, **options: Any) -> dict[str, Any]:
        """Embed ``input`` (a text or a list of texts): ``{"embeddings": [vector, ...], "tokens": n}``.

        Vectors are pooled over the tokens and unit length unless ``normalize=False``; ``tokens``
        counts the input tokens. Only a model loaded for ``feature-extraction`` embeds.
        """
        if self._llama is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.name} was disposed")
        if self.task != EMBEDDING_TASK:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"{self.name} was loaded for {self.task}; load it with task='{EMBEDDING_TASK}' to embed",
            )
        texts = [input] if isinstance(input, str) else list(input)
        if not texts or not all(isinstance(text, str) for text in texts):
            raise AnyformerError(ErrorCode.BAD_REQUEST, "embeddings take a string or a non-empty list of strings")
        vectors, tokens = self._llama.embed(texts, normalize=normalize, truncate=True, return_count=True)
        return {"embeddings": [[float(x) for x in vector] for vector in vectors], "tokens": int(tokens)}

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

    def _render(self, messages: list[Message], thinking: bool) -> tuple[str, bool]:
        """The chat template rendered in the sandbox, and whether the tokenizer should add BOS."""
        prompt = render_chat(
            self._template,
            messages,
            add_generation_prompt=True,
            bos_token=self._bos_text,
            eos_token=self._eos_text,
            enable_thinking=thinking,
        )
        # The template writes BOS itself when it wants one; otherwise the vocabulary's rule applies.
        return prompt, not (self._bos_text and prompt.startswith(self._bos_text))

    def prompt_tokens(self, messages: list[Message], thinking: bool) -> list[int]:
        """The chat template rendered in the sandbox and tokenized (special tokens parsed)."""
        prompt, add_special = self._render(messages, thinking)
        return self._llama.tokenize(prompt.encode("utf-8"), add_bos=add_special, special=True)

    def image_prompt(self, messages: list[Message], thinking: bool) -> tuple[Segments, Chunks]:
        """The prompt of messages with image blocks: token lists and image chunks, each image where it was.

        Each image block becomes the projector's marker (a text block, so the template renders it
        as text); llama.cpp cuts the rendered prompt at the markers. ``BAD_REQUEST`` for an image
        that cannot be decoded, or a template that drops or repeats one.
        """
        assert self._projector is not None
        marker = self._projector.marker
        pictures: list[Any] = []

        def swap(block: dict[str, Any]) -> dict[str, Any]:
            if block["type"] != "image":
                return block
            pictures.append(block["image"])
            return {"type": "text", "text": marker}

        marked: list[Message] = []
        for message in messages:
            content = message["content"]
            marked.append({**message, "content": content if isinstance(content, str) else [swap(b) for b in content]})
        prompt, add_special = self._render(marked, thinking)
        placed = prompt.count(marker)
        if placed != len(pictures):
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"the chat template placed {placed} of the {len(pictures)} images; "
                "images are read only in messages the template keeps",
            )
        return self._projector.tokenize(prompt, pictures, add_special=add_special)

    # ---- the KV cache ---------------------------------------------------------------------------

    def _reuse_prefix(self, tokens: list[int], stop: int | None = None) -> int:
        """How many leading tokens of ``tokens`` the cache already holds, cut back to an evaluation start.

        ``stop`` is where the prompt's first image begins: nothing from there on is reused.
        """
        llama = self._llama
        cached = llama.input_ids[: llama.n_tokens]
        limit = min(len(cached), len(tokens) - 1)  # the last prompt token is always evaluated: we need its logits
        if stop is not None:
            limit = min(limit, stop)
        same = 0
        while same < limit and cached[same] == tokens[same]:
            same += 1
        return max((s for s in self._eval_starts if s <= same), default=0)

    def _eval(self, tokens: list[int]) -> None:
        self._eval_starts.append(self._llama.n_tokens)
        self._llama.eval(tokens)

    def _eval_image(self, image: ImageChunk, *, logits_last: bool) -> None:
        """Decode an image into the cache after what it holds; its positions are marked ``IMAGE``."""
        assert self._projector is not None
        llama = self._llama
        start = llama.n_tokens
        self._eval_starts.append(start)
        llama._ctx.kv_cache_seq_rm(-1, start, -1)
        end = self._projector.eval_image(llama._ctx.ctx, image, start, llama.n_batch, logits_last=logits_last)
        llama.input_ids[start:end] = IMAGE
        llama.n_tokens = end

    def _eval_prompt(self, segments: Segments, prefix: int) -> None:
        """Evaluate what the cache lacks of a prompt: the text after ``prefix``, then every image and text in turn."""
        position = 0
        last = len(segments) - 1
        for index, segment in enumerate(segments):
            if isinstance(segment, ImageChunk):
                self._eval_image(segment, logits_last=index == last)
                position += segment.n_pos
                continue
            end = position + len(segment)
            if end > prefix:
                self._eval(segment[max(prefix - position, 0) :])
            position = end

    def _last_logits(self) -> np.ndarray:
        # llama.cpp keeps the last token's logits at one address while the output buffer is not
        # reallocated; wrapping it in numpy costs ~50 µs, so the view is made again only when it moves.
        pointer = self._lib.llama_get_logits_ith(self._llama._ctx.ctx, -1)
        address = ctypes.cast(pointer, ctypes.c_void_p).value
        if address != self._logits_address:
            self._logits_view = np.ctypeslib.as_array(pointer, shape=(self._n_vocab,))
            self._logits_address = address
        return self._logits_view

    # ---- generation -----------------------------------------------------------------------------

    def stream(self, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
        """Validate what only this backend knows, then return the token stream."""
        if self._llama is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.name} was disposed")
        if self.task == EMBEDDING_TASK:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"{self.name} was loaded for {EMBEDDING_TASK}: it embeds with run(); no generate"
            )
        chunks: Chunks | None = None
        if has_images(messages):
            if self._projector is None:
                raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.name} reads text only: {self._no_images}")
            segments, chunks = self.image_prompt(messages, options.thinking)
        else:
            segments = [self.prompt_tokens(messages, options.thinking)]
        length = _prompt_length(segments)
        if length >= self.context:
            if chunks is not None:
                chunks.close()
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"the prompt is {length} tokens and the context is {self.context}; load with a larger context",
            )
        return self._decode(segments, options, chunks)

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

    def _decode(self, segments: Segments, options: GenerateOptions, chunks: Chunks | None = None) -> Iterator[Chunk]:
        try:
            yield from self._decode_segments(segments, options, chunks)
        finally:
            if chunks is not None:
                chunks.close()

    def _decode_segments(self, segments: Segments, options: GenerateOptions, chunks: Chunks | None) -> Iterator[Chunk]:
        llama = self._llama
        rng = np.random.default_rng(options.seed) if options.temperature > 0 else None
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        is_eog = self._lib.llama_vocab_is_eog
        vocab = self._vocab
        cancel = options.cancel
        prompt = _prompt_length(segments)  # reported on every chunk, for usage counts
        room = self.context - prompt
        budget = min(options.max_new_tokens, room)

        # The prompt as the cache will hold it: token ids, and IMAGE for each position an image takes.
        flat: list[int] = []
        first_image: int | None = None
        for segment in segments:
            if isinstance(segment, ImageChunk):
                first_image = len(flat) if first_image is None else first_image
                flat.extend([IMAGE] * segment.n_pos)
            else:
                flat.extend(segment)
        prefix = self._reuse_prefix(flat, first_image)
        llama.n_tokens = prefix
        del self._eval_starts[
            next((i for i, s in enumerate(self._eval_starts) if s >= prefix), len(self._eval_starts)) :
        ]
        self._eval_prompt(segments, prefix)
        if chunks is not None:
            chunks.close()  # the images are in the cache now
        count = 0
        while not cancel.is_set():
            token = self._choose(self._last_logits(), options, rng)
            if is_eog(vocab, token):
                yield Chunk(
                    delta=decoder.decode(b"", final=True), tokens=count, finish_reason="stop", prompt_tokens=prompt
                )
                return
            count += 1
            yield Chunk(delta=decoder.decode(self._text_piece(token)), tokens=count, prompt_tokens=prompt)
            if count >= budget:
                tail = decoder.decode(b"", final=True)
                yield Chunk(delta=tail, tokens=count, finish_reason="length", prompt_tokens=prompt)
                return
            if cancel.is_set():
                break
            self._eval([token])
        yield Chunk(delta="", tokens=count, finish_reason="cancelled", prompt_tokens=prompt)


def _prompt_length(segments: Segments) -> int:
    """The context a prompt takes: its positions or its KV cells, whichever is more (M-RoPE images differ)."""
    positions = sum(s.n_pos if isinstance(s, ImageChunk) else len(s) for s in segments)
    cells = sum(s.n_tokens if isinstance(s, ImageChunk) else len(s) for s in segments)
    return max(positions, cells)
