"""A qwen3moe or qwen2moe GGUF loaded for the CPU: dense weights, the expert cache, tokenizer, reply stream."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from anyformer import AnyformerError, Chunk, ErrorCode, FinishReason, GenerateOptions, Message, Model, Request
from anyformer.plugin import BackendModel, Features, ProgressCallback, ProgressEvent, format_size
from anyformer_diskformer import BACKEND_ID, native_products
from anyformer_diskformer.cpu_engine import CpuMoEEngine
from anyformer_diskformer.cpu_hybrid import HybridCpuEngine
from anyformer_diskformer.expert_cache import CacheStats, ExpertCache
from anyformer_diskformer.expert_reader import ExpertSlices, expert_spans, open_reader
from anyformer_diskformer.moe_config import MoEConfig, read_moe_config
from anyformer_diskformer.plan import PROMPT_STEP, context_for, plan_from_header
from anyformer_diskformer.policies import EvictionPolicy, make_policy
from anyformer_diskformer.trace import trace_writer_from_env
from anyformer_gguf_gpu.chat_setup import chat_prompt_ids, check_prompt_fits, check_text_only, token_chunk
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.model_choice import fetch_chosen_gguf, load_caps
from anyformer_gguf_gpu.tokenizer import GGUFTokenizer, StreamDecoder

if TYPE_CHECKING:
    from anyformer_diskformer.gpu_engine import GpuMoEEngine
    from anyformer_gguf_gpu.gpu import GPU

    Engine = CpuMoEEngine | GpuMoEEngine

#: Sampling defaults at a temperature above 0 (llama.cpp's own), overridable through ``extra``.
TOP_K = 40
TOP_P = 0.95


def cache_capacity(request: Request, min_cache: int, budget_cache: int, need: int) -> int:
    """The expert cache's bytes: ``pool_bytes`` when the request names it, else what host memory leaves.

    Below one layer's top-k experts is ``BUDGET_TOO_SMALL`` with the budget that would do.
    """
    pool = request.options.get("pool_bytes")
    if pool is not None:
        if not isinstance(pool, int) or isinstance(pool, bool) or pool <= 0:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"pool_bytes must be a positive integer, not {pool!r}")
        if pool < min_cache:
            raise AnyformerError(
                ErrorCode.BUDGET_TOO_SMALL,
                f"pool_bytes {format_size(pool)} is below one layer's top-k experts ({format_size(min_cache)})",
                need=need,
            )
        return pool
    if budget_cache < min_cache:
        raise AnyformerError(
            ErrorCode.BUDGET_TOO_SMALL,
            f"free memory leaves {format_size(max(0, budget_cache))} for experts; one layer's top-k experts take "
            f"{format_size(min_cache)} (the whole load needs {format_size(need)})",
            need=need,
        )
    return budget_cache


def open_device(options: dict[str, object]) -> GPU | None:
    """The GPU the ``device`` load option asks for: ``auto`` (the default) a GPU when wgpu finds one (a
    software adapter only with ``ANYFORMER_SOFTWARE_GPU=1``), else None for the CPU; ``gpu`` one or the
    error why not; ``cpu`` None."""
    wanted = options.get("device", "auto")
    if wanted not in ("auto", "cpu", "gpu"):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"device must be auto, cpu or gpu, not {wanted!r}")
    if wanted == "cpu":
        return None
    from anyformer_gguf_gpu.gpu import GPU

    try:
        return GPU()
    except AnyformerError:
        if wanted == "gpu":
            raise
        return None


def cpu_engine_class(config: MoEConfig) -> type[CpuMoEEngine]:
    """The CPU engine for ``config``'s architecture: Gemma 4's, the delta-net hybrid's (qwen35moe), or the MoE one."""
    from anyformer_diskformer.cpu_gemma4 import Gemma4CpuEngine
    from anyformer_diskformer.gemma4_config import Gemma4Config

    if isinstance(config, Gemma4Config):
        return Gemma4CpuEngine
    return HybridCpuEngine if config.recurrent else CpuMoEEngine


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading ids ``a`` and ``b`` have in common."""
    n = 0
    for x, y in zip(a, b):  # noqa: B905 - the shorter one bounds the common prefix
        if x != y:
            break
        n += 1
    return n


def gpu_engine_class(config: MoEConfig) -> type[GpuMoEEngine]:
    """The wgpu engine for ``config``'s architecture: Gemma 4's, the delta-net hybrid's (qwen35moe), or the MoE
    one."""
    from anyformer_diskformer.gemma4_config import Gemma4Config
    from anyformer_diskformer.gpu_engine import GpuMoEEngine
    from anyformer_diskformer.gpu_gemma4 import Gemma4GpuEngine
    from anyformer_diskformer.gpu_hybrid import HybridGpuEngine

    if isinstance(config, Gemma4Config):
        return Gemma4GpuEngine
    return HybridGpuEngine if config.recurrent else GpuMoEEngine


def device_limit(request: Request, gpu: GPU | None) -> int | None:
    """The bytes the device may hold: the request's budget or the probe's GPU memory on a GPU (host memory
    where the probe knows no GPU size: a software adapter's memory is host memory), the probe's host
    memory on the CPU."""
    import anyformer

    if gpu is None:
        return anyformer.probe(gpu=False).ram_bytes
    if request.budget is not None:
        return request.budget
    caps = anyformer.probe()
    return caps.gpu_bytes if caps.gpu_bytes else caps.ram_bytes


def _count_option(options: dict[str, object], name: str, default: int) -> int:
    value = options.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{name} must be a whole number of at least 0, not {value!r}")
    return value


def prompt_step_option(options: dict[str, object]) -> int:
    """Most tokens a GPU prompt step covers: the ``prompt_step`` load option (default
    :data:`~anyformer_diskformer.plan.PROMPT_STEP`; 1 runs prompts a token a step)."""
    value = _count_option(options, "prompt_step", PROMPT_STEP)
    if value < 1:
        raise AnyformerError(ErrorCode.BAD_REQUEST, "prompt_step must be at least 1")
    return value


def prefetch_options(options: dict[str, object], top_k: int) -> tuple[int, int]:
    """(experts a layer to read ahead, reader threads) from the ``prefetch`` (default: the top-k; 0: none)
    and ``prefetch_threads`` (default 2) load options; ``BAD_REQUEST`` for anything but whole numbers."""
    return _count_option(options, "prefetch", top_k), _count_option(options, "prefetch_threads", 2)


def compute_threads(options: dict[str, object]) -> int:
    """Threads the CPU engine computes a layer's experts on: the ``threads`` load option, else the machine's cores
    up to 4 (experts are few per layer; more threads than that mostly wait)."""
    default = max(1, min(4, os.cpu_count() or 1))
    value = _count_option(options, "threads", default)
    if value < 1:
        raise AnyformerError(ErrorCode.BAD_REQUEST, "threads must be at least 1")
    return value


def attach_prefetcher(cache: ExpertCache[Any], width: int, threads: int, min_cache: int) -> None:
    """Give ``cache`` a prefetcher of ``width`` experts a layer on ``threads`` threads, its read-ahead bytes taken
    from the cache's budget.

    Where the budget cannot spare them and still hold one layer's top-k, there is no prefetcher
    (``prefetch_width`` 0 on the model says so).
    """
    from anyformer_diskformer.prefetch import Prefetcher

    staging = width * cache.expert_bytes
    if width == 0 or threads == 0 or cache.capacity_bytes - staging < min_cache:
        return
    cache.capacity_bytes -= staging
    cache.prefetcher = Prefetcher(cache.reader, cache.stats, width, threads)


def cpu_experts_option(options: dict[str, object]) -> bool:
    """The ``cpu_experts`` load option (default False): whether the GPU engine computes the experts its cache
    misses on the CPU while decoding instead of uploading them; ``BAD_REQUEST`` for anything but a bool."""
    value = options.get("cpu_experts", False)
    if not isinstance(value, bool):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"cpu_experts must be true or false, not {value!r}")
    return value


def policy_for(options: dict[str, object], n_layer: int) -> EvictionPolicy:
    """The eviction policy the ``cache_policy`` load option names (``reuse``, the default, ``lrfu`` or ``lru``)."""
    # reuse by default: it keeps the experts each layer chooses most often and lets a newly read expert
    # displace one only when it is more likely to be used again; on recorded and skewed synthetic traces it
    # is the closest of the three to Belady's optimum (see the docs' figures).
    name = options.get("cache_policy", "reuse")
    try:
        return make_policy(str(name), n_layer)
    except ValueError as exc:
        raise AnyformerError(ErrorCode.BAD_REQUEST, str(exc)) from exc


def sample(logits: np.ndarray, temperature: float, top_k: int, top_p: float, rng: np.random.Generator) -> int:
    """One id drawn at ``temperature`` among the ``top_k`` most likely (0: all) within mass ``top_p``."""
    order = np.argsort(-logits, kind="stable")
    if top_k > 0:  # 0 is no top-k, as llama.cpp reads it, never greedy
        order = order[:top_k]
    z = logits[order].astype(np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    # The fewest ids whose mass reaches top_p (all of them when rounding leaves the sum just below 1).
    keep = min(len(p), int(np.searchsorted(np.cumsum(p), top_p) + 1))
    p = p[:keep] / p[:keep].sum()
    return int(order[rng.choice(keep, p=p)])


class DiskformerModel(BackendModel):
    """The handle ``load`` returns: the CPU engine with its expert cache, the tokenizer, the chat template."""

    backend = BACKEND_ID
    task = "text-generation"
    #: The sampling options its sampler reads; the core refuses the others (``min_p``, ``constraint``…).
    features = Features(honours=frozenset({"top_p", "top_k"}))

    def __init__(self, engine: Engine, tokenizer: GGUFTokenizer, name: str) -> None:
        self.engine: Engine | None = engine
        self.tokenizer = tokenizer
        self.name = name
        self.context = engine.ctx
        #: The primed system prompt's ids and its KV checkpoint (see :meth:`prime`).
        self._primed: tuple[list[int], Any] | None = None
        #: Prompt positions the last reply took from the primed checkpoint instead of computing them.
        self.reused_positions = 0

    @classmethod
    def open(cls, model: Model, request: Request, progress: ProgressCallback) -> DiskformerModel:
        """Fetch the GGUF, check it, size the expert cache from the budget and make the dense weights resident."""
        from anyformer_diskformer.plugin import can_run

        # The file can_run chose, with the machine as it is now (a GPU when a budget was given and allowed).
        gpu_wanted = bool(request.budget) and request.options.get("device", "auto") in ("auto", "gpu")
        verdict = can_run(model, load_caps(request, gpu=gpu_wanted), request)
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
                    from anyformer_diskformer.gpu_engine import GpuSlots

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

    def prompt_ids(self, messages: list[Message], thinking: bool) -> list[int]:
        """The chat template rendered in the core's sandbox, then tokenised with special tokens parsed."""
        return chat_prompt_ids(self.tokenizer, messages, thinking)

    def generate(self, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
        """Check the request now (``BAD_REQUEST`` before any chunk), then return the reply's stream."""
        engine = self.engine
        if engine is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "the model was disposed; load it again")
        check_text_only(messages, BACKEND_ID)
        if options.cancel.is_set():
            return iter([Chunk(tokens=0, finish_reason=FinishReason.CANCELLED.value)])
        try:
            ids = self.prompt_ids(messages, options.thinking)
        except AnyformerError as exc:
            # The core stops a render when the generation is cancelled: that is a cancelled reply, not an error.
            if exc.code is ErrorCode.CANCELLED:
                return iter([Chunk(tokens=0, finish_reason=FinishReason.CANCELLED.value)])
            raise
        check_prompt_fits(ids, engine.ctx)
        return self._reply(engine, ids, options)

    def _reply(self, engine: Engine, ids: list[int], options: GenerateOptions) -> Iterator[Chunk]:
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
            if options.temperature > 0:
                token = sample(logits, options.temperature, top_k, top_p, rng)
            else:
                token = int(np.argmax(logits))
            if token in stops:
                yield Chunk(delta=text.flush(), tokens=count, finish_reason=FinishReason.STOP.value)
                return
            count += 1
            chunk = token_chunk(text, token, count, options.max_new_tokens, len(ids))
            yield chunk
            if chunk.finish_reason is not None:
                return
            batch = [token]
