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
    choice = gguf_refusal(BACKEND_ID, model, request, header_problem)
    if isinstance(choice, Verdict):
        return choice
    file, summary = choice.file, choice.summary
    refusal = store_refusal(BACKEND_ID, model, caps, file)
    if refusal is not None:
        return refusal
    from anyformer_diskformer.plan import context_for, plan_for

    context = context_for(summary, request.context)
    plan = plan_for(file.path, summary, context)
    how = " (estimated from the architecture and the file size: the header's tensors were not read)"
    how = how if plan.estimated else ""
    parts = (
        f"dense weights {format_size(plan.dense_bytes)}, KV cache {format_size(plan.kv_bytes)} at {context} tokens, "
        f"one layer's top-{plan.experts_per_token} experts {format_size(plan.min_cache_bytes)}"
    )
    # The CPU engine holds everything in host memory, so host memory (``caps.ram_bytes``) is the limit;
    # the request's ``budget`` is accelerator memory, which this engine does not use.
    if plan.need > caps.ram_bytes:
        return Verdict.refuse(
            BACKEND_ID,
            Refusal.MEMORY,
            f"{file.name}: needs at least {format_size(plan.need)} of memory ({parts}){how}; "
            f"{format_size(caps.ram_bytes)} available",
            need=plan.need,
        )
    pool = request.options.get("pool_bytes")
    cache = plan.cache_bytes(caps.ram_bytes)
    if isinstance(pool, int) and not isinstance(pool, bool) and pool > 0:
        # An explicit pool replaces what memory leaves (load refuses one below the smallest working cache).
        cache = min(pool, cache)
    return Verdict.accept(
        BACKEND_ID,
        Estimate(
            gpu_bytes=0,
            ram_bytes=plan.fixed_bytes + cache,
            disk_bytes=file.size or 0,
            tok_per_sec=None,
            rank=Rank.SPECIALIST,
            details={
                "file": file.name,
                "architecture": summary.get("architecture"),
                "context": context,
                "device": "cpu",
                "dense_bytes": plan.dense_bytes,
                "kv_cache": plan.kv_bytes,
                "expert_cache": cache,
                "experts_total": plan.expert_bytes_total,
                "estimated": plan.estimated,
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
