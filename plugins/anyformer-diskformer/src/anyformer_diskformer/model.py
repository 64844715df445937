"""The handle diskformer's ``load`` returns: a MoE GGUF loaded (its family's engine on the CPU or the GPU, the expert
cache, the tokenizer), its primed system prompt and its reply stream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

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
)
from anyformer_diskformer import BACKEND_ID
from anyformer_diskformer.arch.registry import read_moe_config
from anyformer_diskformer.cache.expert_cache import CacheStats, ExpertCache, attach_prefetcher
from anyformer_diskformer.cache.expert_reader import ExpertSlices, expert_spans, open_reader
from anyformer_diskformer.compute import native_products
from anyformer_diskformer.engine_choice import cpu_engine_class, device_limit, gpu_engine_class, open_device
from anyformer_diskformer.engines.cpu.moe import CpuMoEEngine
from anyformer_diskformer.load_options import (
    cache_capacity,
    compute_threads,
    cpu_experts_option,
    policy_for,
    prefetch_options,
    prompt_step_option,
)
from anyformer_diskformer.plan import context_for, plan_from_header
from anyformer_diskformer.sampler import TOP_K, TOP_P, sample
from anyformer_diskformer.trace import trace_writer_from_env
from anyformer_diskformer.verdict import verdict_for
from anyformer_gguf_gpu.chat_setup import (
    chat_prompt_ids,
    check_prompt_fits,
    check_text_only,
    reply_constraint,
    token_chunk,
)
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.model_choice import fetch_chosen_gguf, load_caps
from anyformer_gguf_gpu.tokenizer import GGUFTokenizer, StreamDecoder

if TYPE_CHECKING:
    from anyformer_diskformer.engines.gpu.moe import GpuMoEEngine
    from anyformer_gguf_gpu.gpu import GPU

    Engine = CpuMoEEngine | GpuMoEEngine


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading ids ``a`` and ``b`` have in common."""
    n = 0
    for x, y in zip(a, b):  # noqa: B905 - the shorter one bounds the common prefix
        if x != y:
            break
        n += 1
    return n


class DiskformerModel(BackendModel):
    """The handle ``load`` returns: the CPU engine with its expert cache, the tokenizer, the chat template."""

    backend = BACKEND_ID
    task = "text-generation"
    #: The sampling options its sampler reads, constraints (the core's token mask over the GGUF's vocabulary,
    #: on the host logits it samples from anyway) and tools (rendered by the template, a forced call
    #: constrained); the core refuses the others (``min_p``…).
    features = Features(honours=frozenset({"top_p", "top_k", "constraint", "tools"}))

    def __init__(self, engine: Engine, tokenizer: GGUFTokenizer, name: str) -> None:
        self.engine: Engine | None = engine
        self.tokenizer = tokenizer
        self.name = name
        self.context = engine.ctx
        #: The primed system prompt's ids and its KV checkpoint (see :meth:`prime`).
        self._primed: tuple[list[int], Any] | None = None
        #: Prompt positions the last reply took from the primed checkpoint instead of computing them.
        self.reused_positions = 0
        #: The vocabulary constraints compile against (llguidance's tokenizer built at the first one).
        self.constraints = tokenizer.constraint_vocabulary("pip install 'anyformer-diskformer[constrained]'")

    @classmethod
    def open(cls, model: Model, request: Request, progress: ProgressCallback) -> DiskformerModel:
        """Fetch the GGUF, check it, size the expert cache from the budget and make the dense weights resident."""
        # The file can_run chose, with the machine as it is now (a GPU when a budget was given and allowed).
        gpu_wanted = bool(request.budget) and request.options.get("device", "auto") in ("auto", "gpu")
        verdict = verdict_for(model, load_caps(request, gpu=gpu_wanted), request)
        name, fetched = fetch_chosen_gguf(model, progress, BACKEND_ID, verdict)
        path = str(fetched)
        gpu = open_device(request.options)
        gguf = GGUFFile(path)
        try:
            config = read_moe_config(gguf.header)
            tokenizer = GGUFTokenizer(gguf.kv)
            context = context_for(gguf.header.summary(), request.context)
            step = prompt_step_option(request.options)
            plan = plan_from_header(gguf.header, context, "cpu" if gpu is None else "gpu", step)
            capacity = cache_capacity(
                request, plan.min_cache_bytes, plan.cache_bytes(device_limit(request, gpu)), plan.need
            )
            progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=name, message="dense weights"))
            policy = policy_for(request.options, config.n_layer)
            direct = request.options.get("direct_io", True)
            if not isinstance(direct, bool):
                raise AnyformerError(ErrorCode.BAD_REQUEST, f"direct_io must be true or false, not {direct!r}")
            width, threads = prefetch_options(request.options, config.n_expert_used)
            threads_cpu = compute_threads(request.options)
            cpu_experts = cpu_experts_option(request.options)
            spans = expert_spans(gguf, config.n_layer, config.n_expert)
            trace = trace_writer_from_env()
            try:
                engine: Engine
                if gpu is None:
                    if cpu_experts:
                        note = "cpu_experts is ignored: the CPU engine computes every expert on the CPU already"
                        progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=name, message=note))
                    # Compiled now (or read from numba's cache), not on the first token.
                    types = {t.ggml_type for t in gguf.header.tensors}
                    if any(native_products.supports(t) for t in types):
                        progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=name, message="CPU kernels"))
                        native_products.compile_for(types)
                    cache: ExpertCache[ExpertSlices] = ExpertCache(
                        path,
                        gguf.header,
                        config.n_layer,
                        config.n_expert,
                        capacity,
                        policy,
                        reader=open_reader(gguf.paths, spans, direct),
                    )
                    attach_prefetcher(cache, width, threads, plan.min_cache_bytes)
                    try:
                        engine = cpu_engine_class(config)(gguf, config, cache, context, trace)
                        engine.set_threads(threads_cpu)
                    except BaseException:
                        cache.close()
                        raise
                else:
                    from anyformer_diskformer.engines.gpu.moe import GpuSlots

                    def make_cache(slots: GpuSlots) -> ExpertCache[int]:
                        made = ExpertCache(
                            path,
                            gguf.header,
                            config.n_layer,
                            config.n_expert,
                            capacity,
                            policy,
                            store=slots,
                            reader=open_reader(gguf.paths, spans, direct),
                        )
                        attach_prefetcher(made, width, threads, plan.min_cache_bytes)
                        return made

                    engine = gpu_engine_class(config)(
                        gpu, gguf, config, make_cache, context, trace, step, threads_cpu if cpu_experts else 0
                    )
            except BaseException:
                if trace is not None:
                    trace.close()
                raise
        finally:
            gguf.close()  # the dense weights are copied; experts are read through the cache's own descriptor
        loaded = cls(engine, tokenizer, name)
        system = request.options.get("prime")
        if system is not None:
            try:
                loaded.prime(system)  # type: ignore[arg-type]  # prime checks it is a string
            except BaseException:
                loaded.dispose()
                raise
        return loaded

    @property
    def prefetch_width(self) -> int:
        """Experts a layer the prefetcher reads ahead (0: no prefetcher, or disposed)."""
        engine = self.engine
        return engine.cache.prefetcher.width if engine is not None and engine.cache.prefetcher is not None else 0

    @property
    def read_method(self) -> str:
        """How experts are read: ``O_DIRECT``, or ``pread+fadvise`` with the reason O_DIRECT was not used."""
        engine = self.engine
        if engine is None:
            return ""
        reader = engine.cache.reader
        return reader.note or reader.method

    @property
    def cache_stats(self) -> CacheStats | None:
        """The expert cache's counters (None once disposed)."""
        return self.engine.cache.stats if self.engine is not None else None

    def dispose(self) -> None:
        """Drop the engine and close the expert cache; a second call does nothing."""
        self._forget_primed()
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.cache.close()
            engine.release()
            if engine.trace is not None:
                engine.trace.close()
            gpu: GPU | None = getattr(engine, "gpu", None)  # a GPU engine's device, opened for this model alone
            if gpu is not None:
                gpu.close()  # its poll thread stops now, not when Python collects the device

    def prime(self, system: str) -> int:
        """Run ``system`` (a system prompt, rendered through the chat template) now and keep its KV cache:
        the next chats whose prompt starts with the same tokens start after them. Returns the tokens kept.

        A later ``prime`` replaces the checkpoint. Replies are the same with and without it.
        """
        engine = self.engine
        if engine is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "the model was disposed; load it again")
        if not isinstance(system, str) or not system:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "prime takes a non-empty system prompt")
        turn: Message = {"role": "system", "content": system}
        ids = self.prompt_ids([turn], thinking=False)
        if getattr(engine, "resumes_only_whole", False) or hasattr(engine, "resumes_at"):
            # A delta net's state cannot be rewound, and a sliding layer's ring holds only the window before the
            # checkpoint's end (so it resumes at that end, not much before): keep only what every chat with this
            # system prompt shares, the tokens the system turn alone and the system turn followed by a user turn
            # have in common.
            chat = self.prompt_ids([turn, {"role": "user", "content": "?"}], thinking=False)
            ids = ids[: shared_prefix(ids, chat)]
            if not ids:
                raise AnyformerError(ErrorCode.BAD_REQUEST, "the chat template shares no tokens between chats")
        check_prompt_fits(ids, engine.ctx)
        engine.forward(ids, 0, every=False)
        self._forget_primed()
        self._primed = (ids, engine.checkpoint(len(ids)))
        return len(ids)

    def _forget_primed(self) -> None:
        primed, self._primed = self._primed, None
        if primed is not None and self.engine is not None and not isinstance(self.engine, CpuMoEEngine):
            self.engine.forget(primed[1])

    def _resume(self, engine: Engine, ids: list[int]) -> int:
        """Restore the primed KV for the tokens ``ids`` shares with the primed prompt; the position to start at."""
        if self._primed is None:
            return 0
        primed, saved = self._primed
        # The last prompt token is always run: its logits pick the first reply.
        common = min(shared_prefix(ids, primed), len(ids) - 1)
        if getattr(engine, "resumes_only_whole", False) and common != len(primed):
            common = 0  # a delta net's state cannot be rewound to a shorter prefix
        resumes_at = getattr(engine, "resumes_at", None)
        if resumes_at is not None and not resumes_at(len(primed), common):
            common = 0  # a sliding layer's ring no longer holds the window before that position
        if common > 0:
            engine.restore(saved, common)
        return max(0, common)

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
        if options.cancel.is_set():
            return iter([Chunk(tokens=0, finish_reason=FinishReason.CANCELLED.value)])
        try:
            ids = self.prompt_ids(messages, options.thinking, options)
        except AnyformerError as exc:
            # The core stops a render when the generation is cancelled: that is a cancelled reply, not an error.
            if exc.code is ErrorCode.CANCELLED:
                return iter([Chunk(tokens=0, finish_reason=FinishReason.CANCELLED.value)])
            raise
        check_prompt_fits(ids, engine.ctx)
        constraint = reply_constraint(self.tokenizer, options)
        mask = None if constraint is None else self.constraints.mask_for(constraint)
        return self._reply(engine, ids, options, mask)

    def _reply(
        self, engine: Engine, ids: list[int], options: GenerateOptions, mask: TokenMask | None = None
    ) -> Iterator[Chunk]:
        rng = np.random.default_rng(options.seed)
        top_k = int(options.extra.get("top_k", TOP_K))
        top_p = float(options.extra.get("top_p", TOP_P))
        text = StreamDecoder(self.tokenizer)
        stops = self.tokenizer.stop_ids
        start = self._resume(engine, ids)
        self.reused_positions = start
        pos, count = start, 0
        batch = ids[start:]
        while True:
            if options.cancel.is_set():
                yield Chunk(delta=text.flush(), tokens=count, finish_reason=FinishReason.CANCELLED.value)
                return
            if pos + len(batch) > engine.ctx:
                yield Chunk(delta=text.flush(), tokens=count, finish_reason=FinishReason.LENGTH.value)
                return
            logits = engine.forward(batch, pos, every=False)[-1]
            pos += len(batch)
            if mask is not None:
                logits = mask.masked(logits)  # every token that would leave the constraint's language at -inf
            if options.temperature > 0:
                token = sample(logits, options.temperature, top_k, top_p, rng)
            else:
                token = int(np.argmax(logits))
            if token in stops:
                yield Chunk(delta=text.flush(), tokens=count, finish_reason=FinishReason.STOP.value)
                return
            if mask is not None:
                mask.consume(token)
            count += 1
            complete = mask is not None and mask.finished  # the constraint's value is whole: only the end may follow
            chunk = token_chunk(text, token, count, options.max_new_tokens, len(ids), complete=complete)
            yield chunk
            if chunk.finish_reason is not None:
                return
            batch = [token]
