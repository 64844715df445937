"""A GGUF opened with llama.cpp, and the decode loop that streams its replies.

The loop drives ``Llama.eval`` and reads the last logits itself (greedy is an argmax over them; a
temperature draws from a seeded numpy generator), so the per-token work in Python is a few
microseconds over llama-cpp-python's own. The KV cache is kept between calls: a prompt is evaluated
in batches cut at fixed positions and where each message's text begins (``prompt_blocks``,
``prompt_marks``), and a new prompt that shares a prefix with what is cached (a system prompt,
earlier turns) re-evaluates only what follows the last cut both were evaluated at, so the same
messages always give the same logits (greedy repeatability) whatever came before. The prompt's
batches check ``cancel`` between them, so a long prompt stops within one.

``dispose`` never frees what a running stream uses: it asks the stream to stop (at its next batch
or token) and the stream frees the model as it ends.

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
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# llama_cpp before numpy: with numpy 2.5 imported first, a CUDA build's ggml crashed at context
# creation on the H200 machine (numpy's bundled runtime loaded ahead of ggml's). This module is
# imported only by ``load``, after the user's own imports, so it cannot always win the race; the
# import here is what a fresh process (the CLI, a worker) gets.
import llama_cpp
import numpy as np

from anyformer.plugin import (
    TOOL_MARKUP,
    AnyformerError,
    BackendModel,
    Chunk,
    ErrorCode,
    Features,
    GenerateOptions,
    GGUFCandidate,
    LazyArray,
    Message,
    Model,
    ProgressCallback,
    ProgressEvent,
    RpcServerError,
    TokenLogprob,
    chat_constraint,
    check_split_set,
    fetch_files,
    has_images,
    read_gguf_header,
    render_chat,
    tool_inputs,
    usable_cpu_count,
)
from anyformer_llamacpp import BACKEND_ID
from anyformer_llamacpp.constraint import MaskAhead, llama_vocabulary
from anyformer_llamacpp.content_tokens import content_tokens, special_in_content, text_spans
from anyformer_llamacpp.estimate import BATCH, context_for, footprint
from anyformer_llamacpp.header_checks import check_architecture_numbers, check_vocabulary
from anyformer_llamacpp.parallel_option import flash_attention, pick_threads
from anyformer_llamacpp.prompt_blocks import batches, plan, reusable_prefix
from anyformer_llamacpp.prompt_marks import text_starts, token_marks
from anyformer_llamacpp.runtime import gpu_offload_library
from anyformer_llamacpp.sampling import HONOURED_SAMPLING, Sampler
from anyformer_llamacpp.vision import Chunks, ImageChunk, Projector, find_projector

#: The task that loads a GGUF in llama.cpp's embedding mode: ``run(texts)`` returns pooled vectors.
EMBEDDING_TASK = "feature-extraction"
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


class LlamaCppModel(BackendModel):
    """A loaded GGUF: the ``Llama`` object, its chat template, and the KV cache bookkeeping.

    Loaded for ``feature-extraction`` it is an embedding model instead: ``run`` embeds texts and
    ``generate`` is refused.
    """

    backend = BACKEND_ID
    #: Raw completions (``generate(prompt=...)`` continues the text as written, with no chat template),
    #: with the prompt's own tokens scored on request (``prompt_logprobs``); every sampling option
    #: (``sampling.py``), chat logprobs, constraints (``constraint.py``), tools and template variables
    #: (both reach the chat template).
    features = Features(
        raw_text=True,
        prompt_logprobs=True,
        honours=frozenset(HONOURED_SAMPLING | {"logprobs", "constraint", "tools", "template_variables"}),
    )
    #: The multimodal projector that reads image blocks, when the repo has one (set by ``open``).
    _projector: Projector | None = None
    #: The most UTF-8 bytes one token stands for (its vocabulary string bounds it); None when unknown.
    _token_bytes: int | None = None
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
        #: The vocabulary as llguidance reads it, for constraints (built at the first one).
        self.vocabulary = llama_vocabulary(self._vocab, self._n_vocab)
        #: Where a stream's next mask is computed while llama_decode runs (a core free for it only).
        self.mask_ahead = MaskAhead(gpu_layers > 0 or usable_cpu_count() > llama.n_threads)
        self._special_pieces: dict[int, bytes] = {}
        #: The ``special_in_content`` load option: message text tokenized with special tokens parsed.
        self.special_in_content = False
        # Where the batches the cache holds ended (see prompt_blocks): it is cut back only to one of them.
        self._batch_ends: list[int] = []
        #: Positions the last prompt evaluated (the rest came from the cache); for tests and benches.
        self.last_prompt_evaluated = 0
        # Streams and calls using the model now, and whether dispose was asked for: the last user frees it.
        self._guard = threading.Lock()
        self._users = 0
        self._closing = False

    # ---- loading --------------------------------------------------------------------------------

    @classmethod
    def open(
        cls, model: Model, request: Any, progress: ProgressCallback, choice: GGUFCandidate | None
    ) -> LlamaCppModel:
        """Fetch the chosen GGUF (and shards), validate every header, and load it with llama.cpp.

        ``choice`` is the candidate ``can_run`` chose (the plugin's ``load_choice``), None when none fits.
        """
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
        gpu_layers, tensor_split = plan.gpu_layers, None
        if request.rpc:
            gpu_layers, tensor_split = _spread_over_rpc(request.rpc, facts, choice.size, context, budget)
        template = first.get("tokenizer.chat_template")
        task = EMBEDDING_TASK if (request.task or model.task) == EMBEDDING_TASK else "text-generation"
        # A model with its own pooling rule (an embedding GGUF) keeps it; a chat model's vectors are averaged.
        pooled = first.arch_value("pooling_type") is not None
        embedding = task == EMBEDDING_TASK
        mmproj = None if embedding else find_projector(model, facts, progress)
        progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=choice.first.name, total=choice.size))
        llama = cls._open_llama(
            ordered[0], context, gpu_layers, request, embedding=embedding, mean=not pooled, tensor_split=tensor_split
        )
        projector = None
        if mmproj is not None and mmproj.path is not None:
            try:
                with _quiet_native_stderr():
                    projector = Projector.open(
                        mmproj.path, llama._model.model, threads=llama.n_threads, use_gpu=gpu_layers > 0
                    )
            except BaseException:
                llama.close()
                raise
        progress(
            ProgressEvent(stage="load", backend=BACKEND_ID, file=choice.first.name, done=choice.size, total=choice.size)
        )
        chat_template = template if isinstance(template, str) else None
        loaded = cls(llama, chat_template, choice.first.name, context, gpu_layers, task)
        loaded._projector = projector
        loaded.special_in_content = special_in_content(request.options)
        loaded._token_bytes = _longest_token_bytes(first.kv.get("tokenizer.ggml.tokens"))
        if mmproj is not None and mmproj.note:
            loaded._no_images = mmproj.note
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
        from llama_cpp import Llama

        threads = pick_threads(request.options)
        extra: dict[str, Any] = {}
        if embedding:
            extra["embedding"] = True
            if mean:
                extra["pooling_type"] = llama_cpp.LLAMA_POOLING_TYPE_MEAN
        if tensor_split is not None:
            extra["tensor_split"] = tensor_split
        try:
            with _quiet_native_stderr():
                return Llama(
                    model_path=str(path),
                    n_ctx=context,
                    n_threads=threads,
                    n_threads_batch=threads,
                    n_gpu_layers=gpu_layers,
                    n_batch=min(BATCH, context),
                    flash_attn=flash_attention(request.options),
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
        """Free the model and its context, or, while a stream uses them, have it stop and free them as it ends.

        A second call does nothing.
        """
        with self._guard:
            self._closing = True
            free = self._users == 0
        if free:
            self._free()

    @contextlib.contextmanager
    def _using(self) -> Iterator[Any]:
        """Hold the model for a call or a stream: ``dispose`` meanwhile frees it only when this ends."""
        with self._guard:
            if self._closing or self._llama is None:
                raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.name} was disposed")
            self._users += 1
        try:
            yield self._llama
        finally:
            with self._guard:
                self._users -= 1
                free = self._closing and self._users == 0
            if free:
                self._free()

    def _free(self) -> None:
        projector, self._projector = self._projector, None
        if projector is not None:
            projector.close()  # it points into the language model: freed first
        llama, self._llama = self._llama, None
        if llama is not None:
            llama.close()
        self.mask_ahead.close()

    # ---- embeddings -----------------------------------------------------------------------------

    def run(self, input: str | list[str], *, normalize: bool = True, **options: Any) -> dict[str, Any]:
        """Embed ``input`` (a text or a list of texts): ``{"embeddings": [vector, ...], "tokens": n}``.

        Vectors are pooled over the tokens and unit length unless ``normalize=False``; ``tokens``
        counts the input tokens. Only a model loaded for ``feature-extraction`` embeds.
        """
        if self.task != EMBEDDING_TASK:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"{self.name} was loaded for {self.task}; load it with task='{EMBEDDING_TASK}' to embed",
            )
        texts = [input] if isinstance(input, str) else list(input)
        if not texts or not all(isinstance(text, str) for text in texts):
            raise AnyformerError(ErrorCode.BAD_REQUEST, "embeddings take a string or a non-empty list of strings")
        with self._using() as llama:
            vectors, tokens = llama.embed(texts, normalize=normalize, truncate=True, return_count=True)
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
            piece = self._piece(token)
            if not piece:
                # A control token has no text, except tool-call markup ([TOOL_CALLS], <|tool_call|>, Gemma 4's
                # <|"|>…): the core reads calls from the text, so that markup is kept where the model wrote it.
                special = self._piece(token, special=True)
                if special.decode("utf-8", "replace") in TOOL_MARKUP:
                    piece = special
            self._pieces[token] = piece
        return piece

    def _render(
        self, messages: list[Message], thinking: bool, options: GenerateOptions | None = None
    ) -> tuple[str, bool]:
        """The chat template rendered in the sandbox, and whether the tokenizer should add BOS.

        ``options`` brings the tools and the extra template variables, when the call has them.
        """
        variables: dict[str, Any] = {}
        if options is not None:
            variables.update(options.template_variables)
            messages, tool_variables = tool_inputs(self._template, messages, options, self.name)
            variables.update(tool_variables)
        # A prompt of more characters than the context's tokens can stand for cannot fit: the render
        # stops there, before megabytes are rendered and tokenized only to be refused.
        cap = self.context * self._token_bytes if self._token_bytes else None
        prompt = render_chat(
            self._template,
            messages,
            add_generation_prompt=True,
            bos_token=self._bos_text,
            eos_token=self._eos_text,
            max_chars=cap,
            enable_thinking=thinking,
            **variables,
        )
        # The template writes BOS itself when it wants one; otherwise the vocabulary's rule applies.
        return prompt, not (self._bos_text and prompt.startswith(self._bos_text))

    def prompt_tokens(self, messages: list[Message], thinking: bool) -> list[int]:
        """The chat template rendered in the sandbox and tokenized (special tokens parsed)."""
        return self.prompt_with_marks(messages, thinking)[0]

    def prompt_with_marks(
        self, messages: list[Message], thinking: bool, options: GenerateOptions | None = None
    ) -> tuple[list[int], list[int]]:
        """The prompt's tokens, and the positions where its messages' texts begin (see ``prompt_marks``)."""
        prompt, add_special = self._render(messages, thinking, options)
        # Special tokens a user, system or tool text spells stay text (content_tokens), unless the operator asked.
        spans = [] if self.special_in_content else text_spans(prompt, messages, self._spells_special)
        tokens = content_tokens(prompt, spans, add_special, self._tokenize)
        bos = self._llama.token_bos()
        skip = 1 if add_special and tokens and bos >= 0 and tokens[0] == bos else 0
        return tokens, token_marks(prompt, tokens, self._special_piece, text_starts(prompt, messages), skip)

    def _tokenize(self, text: str, add_bos: bool, special: bool) -> list[int]:
        return list(self._llama.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special))

    def _spells_special(self, text: str) -> bool:
        """Whether ``text`` holds a special token's spelling (it tokenizes differently with them parsed)."""
        return self._tokenize(text, False, True) != self._tokenize(text, False, False)

    def _special_piece(self, token: int) -> bytes:
        piece = self._special_pieces.get(token)
        if piece is None:
            piece = self._special_pieces[token] = self._piece(token, special=True)
        return piece

    def raw_prompt_tokens(self, prompt: str) -> list[int]:
        """A raw prompt tokenized as llama.cpp's server does: BOS (and EOS) by the vocabulary's
        ``add_bos_token``/``add_eos_token``, special tokens parsed; an empty prompt is BOS alone."""
        if self._token_bytes and len(prompt) > self.context * self._token_bytes:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"the prompt is {len(prompt):,} characters, more than a {self.context}-token context can hold",
            )
        if prompt:
            tokens: list[int] = self._llama.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        else:
            bos = self._llama.token_bos()
            tokens = [bos] if bos >= 0 else []
        if not tokens:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"the prompt is empty and {self.name} has no BOS token")
        return tokens

    def infill_tokens(self, prefix: str, suffix: str, max_new_tokens: int) -> list[int]:
        """The fill-in-the-middle prompt llama.cpp's ``/infill`` builds for ``prefix`` and ``suffix``.

        ``[repo and file markers] [BOS] FIM_PRE prefix FIM_SUF suffix FIM_MID``: the texts are
        tokenized without special tokens, the prefix keeps its last ``3/4`` of a batch of tokens
        and the suffix its first ``1/4`` less two (as llama.cpp cuts them), and a vocabulary with
        repo-level tokens (``fim_rep``, ``fim_sep``) gets llama.cpp's ``myproject``/``filename``
        lines before the rest as far as the context leaves room. ``BAD_REQUEST`` for a model without
        ``fim_pre``/``fim_suf``/``fim_mid`` tokens.
        """
        lib, vocab, llama = self._lib, self._vocab, self._llama
        pre, suf, mid = lib.llama_vocab_fim_pre(vocab), lib.llama_vocab_fim_suf(vocab), lib.llama_vocab_fim_mid(vocab)
        if min(pre, suf, mid) < 0:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"{self.name} has no fill-in-the-middle tokens (fim_pre, fim_suf, fim_mid)"
            )
        for text in (prefix, suffix):
            if self._token_bytes and len(text) > self.context * self._token_bytes:
                raise AnyformerError(
                    ErrorCode.BAD_REQUEST,
                    f"the text is {len(text):,} characters, more than a {self.context}-token context can hold",
                )

        def plain(text: str) -> list[int]:
            return llama.tokenize(text.encode("utf-8"), add_bos=False, special=False) if text else []

        extra: list[int] = []
        if lib.llama_vocab_fim_rep(vocab) >= 0:
            extra += [lib.llama_vocab_fim_rep(vocab), *plain("myproject\n")]
        if lib.llama_vocab_fim_sep(vocab) >= 0:
            extra += [lib.llama_vocab_fim_sep(vocab), *plain("filename\n")]
        batch = llama.n_batch
        prefix_tokens = plain(prefix)
        prefix_tokens = prefix_tokens[len(prefix_tokens) - min(len(prefix_tokens), 3 * (batch // 4)) :]
        suffix_tokens = plain(suffix)[: max(0, batch // 4 - 2)]
        extra_take = min(max(0, self.context - batch - 2 * max_new_tokens), len(extra))
        bos = [llama.token_bos()] if lib.llama_vocab_get_add_bos(vocab) and llama.token_bos() >= 0 else []
        return [*extra[len(extra) - extra_take :], *bos, pre, *prefix_tokens, suf, *suffix_tokens, mid]

    def image_prompt(
        self, messages: list[Message], thinking: bool, options: GenerateOptions | None = None
    ) -> tuple[Segments, Chunks]:
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
        prompt, add_special = self._render(marked, thinking, options)
        placed = prompt.count(marker)
        if placed != len(pictures):
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"the chat template placed {placed} of the {len(pictures)} images; "
                "images are read only in messages the template keeps",
            )
        return self._projector.tokenize(prompt, pictures, add_special=add_special)

    # ---- the KV cache ---------------------------------------------------------------------------

    def _cut_back(self, flat: list[int], ends: list[int], first_image: int | None) -> int:
        """Cut the cache back to the last cut of ``flat``'s plan ``ends`` it shares with it; return that position."""
        llama = self._llama
        prefix = reusable_prefix(llama.input_ids[: llama.n_tokens], self._batch_ends, flat, ends, first_image)
        llama.n_tokens = prefix  # llama.eval removes the cache's cells from here on
        self._batch_ends = [end for end in self._batch_ends if end <= prefix]
        return prefix

    def _eval_image(self, image: ImageChunk, *, logits_last: bool) -> None:
        """Decode an image into the cache after what it holds; its positions are marked ``IMAGE``."""
        assert self._projector is not None
        llama = self._llama
        start = llama.n_tokens
        llama._ctx.kv_cache_seq_rm(-1, start, -1)
        end = self._projector.eval_image(llama._ctx.ctx, image, start, llama.n_batch, logits_last=logits_last)
        llama.input_ids[start:end] = IMAGE
        llama.n_tokens = end

    def _eval_prompt(self, segments: Segments, prefix: int, ends: list[int], stopped: Callable[[], bool]) -> bool:
        """Evaluate what the cache lacks of a prompt, from ``prefix``: text in the batches of its plan
        ``ends``, images whole.

        ``stopped()`` is asked before each batch; returns False when it said stop (the cache then
        holds the batches done so far, every one of them reusable).
        """
        llama = self._llama
        position = 0
        last = len(segments) - 1
        for index, segment in enumerate(segments):
            if stopped():
                return False
            if isinstance(segment, ImageChunk):
                self._eval_image(segment, logits_last=index == last)
                position += segment.n_pos
                self._batch_ends.append(llama.n_tokens)  # never reused: the reuse stops at the first image
                continue
            end = position + len(segment)
            for first, stop in batches(ends, max(prefix, position), end):
                if stopped():
                    return False
                llama.eval(segment[first - position : stop - position])
                self.last_prompt_evaluated += stop - first
                self._batch_ends.append(stop)
            position = end
        return True

    def _score_prompt(
        self, tokens: list[int], ends: list[int], top: int, stopped: Callable[[], bool]
    ) -> tuple[TokenLogprob, ...] | None:
        """Evaluate a raw prompt from position 0 with logits at every position, and return each
        token's log-probability under the positions before it (the first has none: None).

        The cache is not reused for such a prompt: the reused positions' logits are gone. The
        batches still end on the plan ``ends``, so a later prompt reuses this one's as usual.
        A BOS the tokenizer added gets no entry (it is not in the prompt's text). None when
        ``stopped()`` said stop.
        """
        llama, ctx = self._llama, self._llama._ctx
        llama.n_tokens = 0
        self._batch_ends = []
        bos = 1 if tokens[0] == llama.token_bos() else 0
        entries = [] if bos else [TokenLogprob(self._token_text(tokens[0]), None)]
        for first, stop in batches(ends, 0, len(tokens)):
            if stopped():
                return None
            piece = tokens[first:stop]
            ctx.kv_cache_seq_rm(-1, first, -1)
            llama._batch.set_batch(batch=piece, n_past=first, logits_all=True)
            ctx.decode(llama._batch)
            llama.input_ids[first:stop] = piece
            llama.n_tokens = stop
            self.last_prompt_evaluated += stop - first
            self._batch_ends.append(stop)
            rows = np.ctypeslib.as_array(self._lib.llama_get_logits(ctx.ctx), shape=(stop - first, self._n_vocab))
            for row, position in enumerate(range(first, min(stop, len(tokens) - 1))):
                entries.append(self._token_logprob(rows[row], tokens[position + 1], top))
        return tuple(entries)

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

    def generate(self, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
        """Validate what only this backend knows, then return the token stream."""
        if self.task == EMBEDDING_TASK:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"{self.name} was loaded for {EMBEDDING_TASK}: it embeds with run(); no generate"
            )
        chunks: Chunks | None = None
        segments: Segments
        marks: list[int] = []
        with self._using():
            if options.prompt is not None and options.suffix is not None:
                segments = [self.infill_tokens(options.prompt, options.suffix, options.max_new_tokens)]
            elif options.prompt is not None:
                segments = [self.raw_prompt_tokens(options.prompt)]
            elif has_images(messages):
                if self._projector is None:
                    raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.name} reads text only: {self._no_images}")
                segments, chunks = self.image_prompt(messages, options.thinking, options)
            else:
                tokens, marks = self.prompt_with_marks(messages, options.thinking, options)
                segments = [tokens]
            try:
                sampler = self.sampler_for(options)
            except BaseException:
                if chunks is not None:
                    chunks.close()
                raise
        length = _prompt_length(segments)
        if length >= self.context:
            if chunks is not None:
                chunks.close()
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"the prompt is {length} tokens and the context is {self.context}; load with a larger context",
            )
        return self._decode(segments, options, chunks, marks, sampler)

    def sampler_for(self, options: GenerateOptions) -> Sampler:
        """The stream's token choice; ``BAD_REQUEST`` for a logit_bias token outside the vocabulary or a
        constraint that does not compile."""
        constraint = chat_constraint(options, self._template)  # a forced call in the template family's syntax
        if constraint is None:
            return Sampler(options, self._n_vocab)
        mask = self.vocabulary.mask_for(constraint)
        return Sampler(options, self._n_vocab, mask, self.mask_ahead.executor())

    def _token_logprob(self, logits: np.ndarray, token: int, top: int) -> TokenLogprob:
        """The chosen token's log-probability and the ``top`` likeliest alternatives, as llama.cpp's
        completions report them: a log-softmax of the raw logits (before temperature and top-k/top-p)."""
        shifted = logits.astype(np.float64) - float(logits.max())
        logprobs = shifted - np.log(np.exp(shifted).sum())
        pairs: list[tuple[str, float]] = []
        if top > 0:
            best = np.argpartition(-logprobs, top - 1)[:top]
            best = best[np.argsort(-logprobs[best], kind="stable")]
            pairs = [(self._token_text(int(i)), float(logprobs[i])) for i in best]
            if token not in best:
                pairs.append((self._token_text(token), float(logprobs[token])))
        return TokenLogprob(self._token_text(token), float(logprobs[token]), tuple(pairs))

    def _token_text(self, token: int) -> str:
        # Bytes of a character cut across tokens are left out, as llama-cpp-python reports them.
        return self._text_piece(token).decode("utf-8", "ignore")

    def _decode(
        self,
        segments: Segments,
        options: GenerateOptions,
        chunks: Chunks | None = None,
        marks: list[int] | None = None,
        sampler: Sampler | None = None,
    ) -> Iterator[Chunk]:
        try:
            with self._using():
                chooser = sampler if sampler is not None else Sampler(options, self._n_vocab)
                yield from self._decode_segments(segments, options, chunks, marks or [], chooser)
        finally:
            if chunks is not None:
                chunks.close()

    def _decode_segments(
        self, segments: Segments, options: GenerateOptions, chunks: Chunks | None, marks: list[int], sampler: Sampler
    ) -> Iterator[Chunk]:
        llama = self._llama
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        is_eog = self._lib.llama_vocab_is_eog
        vocab = self._vocab
        cancel = options.cancel

        def stopped() -> bool:
            return cancel.is_set() or self._closing

        prompt = _prompt_length(segments)  # reported on every chunk, for usage counts
        room = self.context - prompt
        budget = min(options.max_new_tokens, room)

        # The prompt as the cache will hold it: token ids, and IMAGE for each position an image takes.
        # Its batches end on the block grid, at the marks, and where a segment (an image) begins or ends.
        flat: list[int] = []
        first_image: int | None = None
        for segment in segments:
            if isinstance(segment, ImageChunk):
                first_image = len(flat) if first_image is None else first_image
                flat.extend([IMAGE] * segment.n_pos)
            else:
                flat.extend(segment)
            marks.append(len(flat))
        ends = plan(len(flat), marks)
        self.last_prompt_evaluated = 0
        if options.prompt_logprobs and options.logprobs is not None and chunks is None:
            scored = self._score_prompt(flat, ends, options.logprobs, stopped)
            finished = scored is not None
            if scored is not None:
                yield Chunk(tokens=0, prompt_tokens=prompt, prompt_logprobs=scored)
                if budget == 0:  # scoring alone (max_new_tokens=0)
                    yield Chunk(tokens=0, finish_reason="length", prompt_tokens=prompt)
                    return
        else:
            prefix = self._cut_back(flat, ends, first_image)
            finished = self._eval_prompt(segments, prefix, ends, stopped)
        if chunks is not None:
            chunks.close()  # the images are in the cache now
        count = 0
        while finished and not stopped():
            logits = self._last_logits()
            token = sampler.choose(logits)
            if is_eog(vocab, token):
                yield Chunk(
                    delta=decoder.decode(b"", final=True), tokens=count, finish_reason="stop", prompt_tokens=prompt
                )
                return
            count += 1
            logprobs = () if options.logprobs is None else (self._token_logprob(logits, token, options.logprobs),)
            sampler.accept(token)
            yield Chunk(
                delta=decoder.decode(self._text_piece(token)), tokens=count, prompt_tokens=prompt, logprobs=logprobs
            )
            if sampler.finished:  # the constraint's value is complete: only the end could follow
                yield Chunk(
                    delta=decoder.decode(b"", final=True), tokens=count, finish_reason="stop", prompt_tokens=prompt
                )
                return
            if count >= budget:
                tail = decoder.decode(b"", final=True)
                yield Chunk(delta=tail, tokens=count, finish_reason="length", prompt_tokens=prompt)
                return
            if stopped():
                break
            llama.eval([token])
        yield Chunk(delta="", tokens=count, finish_reason="cancelled", prompt_tokens=prompt)


def _spread_over_rpc(
    endpoints: tuple[str, ...], facts: dict[str, Any], weights_bytes: int, context: int, local_gpu: int
) -> tuple[int, list[float]]:
    """Ask the RPC servers again (one may have gone since ``can_run``), add them to llama.cpp's devices,
    and return ``n_gpu_layers`` and ``tensor_split`` for the plan over them."""
    from anyformer_llamacpp.rpc_devices import probe_servers, register_servers
    from anyformer_llamacpp.rpc_split import devices_of, order_for_output, plan_split

    try:
        servers = order_for_output(probe_servers(endpoints))
        register_servers(servers)
    except RpcServerError as exc:
        raise AnyformerError(ErrorCode.NO_BACKEND, str(exc)) from None
    local = local_gpu if gpu_offload_library() is not None else 0
    plan = plan_split(facts, weights_bytes, context, min(BATCH, context), devices_of(servers, local))
    return plan.n_gpu_layers, plan.tensor_split


def _longest_token_bytes(tokens: Any) -> int | None:
    """The UTF-8 length of the vocabulary's longest token string: no token's text is longer (``Ġ``, ``▁`` and
    ``<0x0A>`` each stand for one byte)."""
    if isinstance(tokens, LazyArray) and tokens.is_strings:
        # The header's bytes are the strings' UTF-8 (checked when it was read): no need to decode 49k strings.
        return max(map(len, tokens.raw_strings()), default=0) or None
    if not isinstance(tokens, list) or not tokens:
        return None
    return max((len(token.encode("utf-8", "replace")) for token in tokens if isinstance(token, str)), default=0) or None


def _prompt_length(segments: Segments) -> int:
    """The context a prompt takes: its positions or its KV cells, whichever is more (M-RoPE images differ)."""
    positions = sum(s.n_pos if isinstance(s, ImageChunk) else len(s) for s in segments)
    cells = sum(s.n_tokens if isinstance(s, ImageChunk) else len(s) for s in segments)
    return max(positions, cells)
