"""A GGUF loaded on the GPU: the engine, its tokenizer and chat template, and the reply stream."""

from __future__ import annotations

from collections.abc import Generator, Iterator

from anyformer.plugin import (
    AnyformerError,
    BackendModel,
    Chunk,
    ErrorCode,
    Features,
    FinishReason,
    GenerateOptions,
    Message,
    Model,
    ProgressCallback,
    ProgressEvent,
    Request,
    TokenMask,
    Verdict,
)
from anyformer_gguf_gpu.chat_setup import (
    chat_prompt_ids,
    check_prompt_fits,
    check_text_only,
    reply_constraint,
    token_chunk,
)
from anyformer_gguf_gpu.decode import constrained, greedy, sampled
from anyformer_gguf_gpu.engines import open_engine
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.gpu import GPU, gpu_errors
from anyformer_gguf_gpu.model_choice import fetch_chosen_gguf
from anyformer_gguf_gpu.tokenizer import GGUFTokenizer, StreamDecoder
from anyformer_gguf_gpu.transformer import TransformerEngine
from anyformer_localmind import BACKEND_ID
from anyformer_localmind.estimate import MAX_BATCH, context_for

#: Sampling defaults at a temperature above 0 (llama.cpp's own), overridable through ``extra``.
TOP_K = 40
TOP_P = 0.95


class LocalMindModel(BackendModel):
    """The handle ``load`` returns: the engine on the GPU, the tokenizer, the chat template."""

    backend = BACKEND_ID
    task = "text-generation"
    #: The sampling options its sampler reads, constraints (the core's token mask over the GGUF's vocabulary,
    #: applied to logits read back to the host: decode.py's ``constrained``) and tools (rendered by the
    #: template, a forced call constrained); the core refuses the others (``min_p``…).
    features = Features(honours=frozenset({"top_p", "top_k", "constraint", "tools"}))

    def __init__(self, engine: TransformerEngine, tokenizer: GGUFTokenizer, name: str) -> None:
        self.engine: TransformerEngine | None = engine
        self.tokenizer = tokenizer
        self.name = name
        self.context = engine.ctx
        self.gpu_bytes = engine.gpu_bytes
        #: The vocabulary constraints compile against (llguidance's tokenizer built at the first one).
        self.constraints = tokenizer.constraint_vocabulary("pip install 'anyformer-localmind[constrained]'")

    @classmethod
    def open(cls, model: Model, request: Request, progress: ProgressCallback, verdict: Verdict) -> LocalMindModel:
        """Fetch the GGUF ``verdict`` chose (``can_run``'s, judged with the memory free now), check it, upload
        its weights and compile the kernels (progress reported)."""
        name, path = fetch_chosen_gguf(model, progress, BACKEND_ID, verdict)
        gguf = GGUFFile(path)
        try:
            tokenizer = GGUFTokenizer(gguf.kv)
            gpu = GPU()

            def report(what: str, done: int, total: int) -> None:
                progress(
                    ProgressEvent(stage="load", backend=BACKEND_ID, file=name, done=done, total=total, message=what)
                )

            context = context_for(gguf.header.summary(), request.context)
            engine = open_engine(gpu, gguf, ctx=context, max_batch=MAX_BATCH, progress=report)
        finally:
            gguf.close()  # the weights are on the GPU now; the mapping is no longer needed
        return cls(engine, tokenizer, name)

    def dispose(self) -> None:
        """Drop the engine, its GPU buffers and its device (and the poll thread with it); a second call does nothing."""
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.release()
            engine.gpu.close()  # the device was opened for this model alone

    def prompt_ids(self, messages: list[Message], thinking: bool, options: GenerateOptions | None = None) -> list[int]:
        """The chat template rendered in the core's sandbox (with ``options``' tools), then tokenised with special
        tokens parsed."""
        return chat_prompt_ids(self.tokenizer, messages, thinking, options, self.name)

    def generate(self, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
        """Check the request now (``BAD_REQUEST`` before any chunk), then return the reply's stream."""
        engine = self.engine
        if engine is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "the model was disposed; load it again")
        check_text_only(messages, BACKEND_ID)
        ids = self.prompt_ids(messages, options.thinking, options)
        check_prompt_fits(ids, engine.ctx)
        constraint = reply_constraint(self.tokenizer, options)
        mask = None if constraint is None else self.constraints.mask_for(constraint)
        return self._reply(engine, ids, options, mask)

    def _reply(
        self, engine: TransformerEngine, ids: list[int], options: GenerateOptions, mask: TokenMask | None = None
    ) -> Iterator[Chunk]:
        limit = min(options.max_new_tokens, engine.ctx - len(ids))
        tokens: Generator[int, None, None]
        if mask is not None:
            tokens = constrained(
                engine,
                ids,
                limit,
                mask,
                temperature=options.temperature,
                seed=options.seed,
                top_k=int(options.extra.get("top_k", TOP_K)),
                top_p=float(options.extra.get("top_p", TOP_P)),
                cancel=options.cancel,
            )
        elif options.temperature > 0:
            top_k = int(options.extra.get("top_k", TOP_K))
            top_p = float(options.extra.get("top_p", TOP_P))
            tokens = sampled(
                engine,
                ids,
                limit,
                temperature=options.temperature,
                seed=options.seed,
                top_k=top_k,
                top_p=top_p,
                cancel=options.cancel,
            )
        else:
            tokens = greedy(engine, ids, limit, cancel=options.cancel)
        text = StreamDecoder(self.tokenizer)
        stops = self.tokenizer.stop_ids
        count = 0
        try:
            while True:
                if options.cancel.is_set():
                    yield Chunk(delta=text.flush(), tokens=count, finish_reason=FinishReason.CANCELLED.value)
                    return
                with gpu_errors("generating"):
                    token = next(tokens, None)
                if token is None or token in stops:
                    # No token left means the context is full: that is a length limit, not a stop.
                    finish = FinishReason.STOP if token is not None else FinishReason.LENGTH
                    yield Chunk(delta=text.flush(), tokens=count, finish_reason=finish.value)
                    return
                count += 1
                complete = mask is not None and mask.finished  # the constraint's value is whole
                chunk = token_chunk(text, token, count, options.max_new_tokens, len(ids), complete=complete)
                yield chunk
                if chunk.finish_reason is not None:
                    return
        finally:
            tokens.close()
