"""The anyformer hooks of the diskformer backend. Nothing heavy is imported here.

``can_run`` decides from the description (the core read the GGUF's header; when the file is on disk
its tensor sizes give exact figures): the format, the task, whether the engine reads the MoE
architecture, every weight type and the tokenizer, and whether dense weights + the KV cache + the
smallest working expert cache (one layer's top-k experts) fit host memory (``caps.ram_bytes``).
"""

from __future__ import annotations

from collections.abc import Iterator

from anyformer import (
    BackendModel,
    Caps,
    Chunk,
    Estimate,
    GenerateOptions,
    Message,
    Model,
    ProgressCallback,
    Rank,
    Refusal,
    Request,
    StoreEntry,
    Verdict,
    format_size,
    hookimpl,
)
from anyformer_diskformer import BACKEND_ID
from anyformer_gguf_gpu.model_choice import gguf_refusal, store_refusal, tokenizer_problem
from anyformer_gguf_gpu.split_set import partial_set_refusal


def header_problem(summary: dict[str, object]) -> str | None:
    """Why the engine does not read this GGUF (architecture, weight types, tokenizer), or None."""
    from anyformer_diskformer.moe_config import moe_problem

    problem = moe_problem(summary)
    if problem is not None:
        return problem
    return tokenizer_problem(summary)


@hookimpl
def can_run(model: Model, caps: Caps, request: Request) -> Verdict:
    """Refuse with ``format``/``task``/``model``/``store``/``memory``, or estimate the host memory it holds."""
    partial = partial_set_refusal(BACKEND_ID, model)
    if partial is not None:
        return partial
    choice = gguf_refusal(BACKEND_ID, model, request, header_problem)
    if isinstance(choice, Verdict):
        return choice
    file, summary = choice.file, choice.summary
    refusal = store_refusal(BACKEND_ID, model, caps, file)
    if refusal is not None:
        return refusal
    from anyformer_diskformer.plan import PROMPT_STEP, RAM_OVERHEAD, context_for, plan_for

    wanted = request.options.get("device", "auto")
    device = "gpu" if caps.gpu and wanted in ("auto", "gpu") else "cpu"
    context = context_for(summary, request.context)
    step = request.options.get("prompt_step", PROMPT_STEP)
    # A bad value is the load's BAD_REQUEST; the check sizes with the default meanwhile.
    step = step if isinstance(step, int) and not isinstance(step, bool) and step >= 1 else PROMPT_STEP
    plan = plan_for(file.path, summary, context, device, step)
    how = " (estimated from the architecture and the file size: the header's tensors were not read)"
    how = how if plan.estimated else ""
    parts = (
        f"dense weights {format_size(plan.dense_bytes)}, KV cache {format_size(plan.kv_bytes)} at {context} tokens, "
        f"one layer's top-{plan.experts_per_token} experts {format_size(plan.min_cache_bytes)}"
    )
    if device == "gpu":
        # Dense weights, the KV cache and the expert slots live in GPU memory: the budget bounds them.
        limit = request.budget if request.budget is not None else (caps.gpu_bytes or caps.ram_bytes)
        code, what = Refusal.BUDGET, "GPU memory"
    else:
        # The CPU engine holds everything in host memory (``caps.ram_bytes``).
        limit, code, what = caps.ram_bytes, Refusal.MEMORY, "memory"
    if plan.need > limit:
        return Verdict.refuse(
            BACKEND_ID,
            code,
            f"{file.name}: needs at least {format_size(plan.need)} of {what} ({parts}){how}; "
            f"{format_size(limit)} available",
            need=plan.need,
        )
    if device == "gpu" and RAM_OVERHEAD > caps.ram_bytes:
        # The GPU engine still keeps its tokenizer, host copies of the norms and the reads in flight in host memory.
        return Verdict.refuse(
            BACKEND_ID,
            Refusal.MEMORY,
            f"{file.name}: the GPU engine needs {format_size(RAM_OVERHEAD)} of host memory besides the GPU's; "
            f"{format_size(caps.ram_bytes)} available",
            need=RAM_OVERHEAD,
        )
    pool = request.options.get("pool_bytes")
    cache = plan.cache_bytes(limit)
    if isinstance(pool, int) and not isinstance(pool, bool) and pool > 0:
        # An explicit pool replaces what memory leaves (load refuses one below the smallest working cache).
        cache = min(pool, cache)
    held = plan.fixed_bytes + cache
    from anyformer_diskformer.speed import tok_per_sec

    speed, speed_model = tok_per_sec(file.path, plan, cache, device)
    return Verdict.accept(
        BACKEND_ID,
        Estimate(
            gpu_bytes=held if device == "gpu" else 0,
            ram_bytes=RAM_OVERHEAD if device == "gpu" else held,
            disk_bytes=file.size or 0,
            tok_per_sec=speed,
            rank=Rank.SPECIALIST,
            details={
                "file": file.name,
                "architecture": summary.get("architecture"),
                "context": context,
                "device": device,
                "dense_bytes": plan.dense_bytes,
                "kv_cache": plan.kv_bytes,
                "expert_cache": cache,
                "experts_total": plan.expert_bytes_total,
                "estimated": plan.estimated,
                "tok_per_sec_model": speed_model,
            },
            files=(file.name,),
        ),
    )


@hookimpl
def load(backend: str, model: Model, request: Request, progress: ProgressCallback) -> BackendModel | None:
    """Fetch the GGUF, keep its dense tensors resident and open the expert cache."""
    if backend != BACKEND_ID:
        return None
    from anyformer_diskformer.engine import DiskformerModel

    return DiskformerModel.open(model, request, progress)


@hookimpl
def generate(loaded: BackendModel, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk] | None:
    """Stream a chat reply from a model this backend loaded."""
    if loaded.backend != BACKEND_ID:
        return None
    from anyformer_diskformer.engine import DiskformerModel

    assert isinstance(loaded, DiskformerModel)
    return loaded.stream(messages, options)


@hookimpl
def store_list() -> list[StoreEntry]:
    """Nothing: the GGUFs live in the Hugging Face cache (listed by the core); nothing is derived."""
    return []
