"""diskformer's verdict on a model (its ``can_run``). Nothing heavy is imported here.

``can_run`` decides from the description and never opens the model file for its plan: the header
summary of the file it would load comes from the core (read on demand; its ``tensor_bytes`` give the
experts' and dense weights' bytes), and without one it estimates roughly from the architecture and
the file sizes. It checks the format, the task (a repo tagged ``image-text-to-text`` runs as text
chat), which file (Q4_K_M first, the next smaller one when one does not fit), whether the engine reads
the MoE architecture, every weight type and the tokenizer, and whether dense weights + the KV cache +
the smallest working expert cache (one layer's top-k experts) fit the device's memory.
"""

from __future__ import annotations

from anyformer.plugin import Caps, Estimate, Model, Rank, Refusal, Request, Verdict, format_size
from anyformer_diskformer import BACKEND_ID
from anyformer_gguf_gpu.model_choice import GgufChoice, choose_and_judge, store_refusal

#: The order diskformer tries a repo's files in: 4-bit K-quants and Q4_0 first (the expert reads are the cost),
#: then the wider types its kernels read; the next smaller file when one does not fit.
PREFERRED_QUANTS = ("Q4_K_M", "Q4_0", "Q4_K_S", "Q4_1", "Q5_K_M", "Q5_K_S", "Q6_K", "Q8_0", "BF16", "F16", "F32")
#: Names whose weight types the kernels may read; the K-quant mixes (``_L``, ``_XL``) are decided by their header.
READABLE_QUANTS = (*PREFERRED_QUANTS, "Q4_K", "Q5_K", "Q4_K_L", "Q4_K_XL", "Q5_K_L", "Q5_K_XL", "Q6_K_L", "Q6_K_XL")


def model_problem(summary: dict[str, object]) -> str | None:
    """Why the engine does not run the summary's model (a mixture of experts it reads, weight types), or None."""
    from anyformer_diskformer.arch.registry import moe_problem

    return moe_problem(summary)


def verdict_for(model: Model, caps: Caps, request: Request) -> Verdict:
    """Refuse with ``format``/``task``/``model``/``store``/``memory``, or estimate the host memory it holds
    (the ``can_run`` hook, and the load's choice of file with the machine as it is then)."""
    return choose_and_judge(
        BACKEND_ID,
        model,
        request,
        preference=PREFERRED_QUANTS,
        readable_quants=READABLE_QUANTS,
        model_problem=model_problem,
        judge=lambda choice: _judge(model, caps, request, choice),
    )


def _judge(model: Model, caps: Caps, request: Request, choice: GgufChoice) -> Verdict:
    """The verdict on one file (or split set): the store, and whether its plan fits the device."""
    file, summary = choice.file, choice.summary
    refusal = store_refusal(BACKEND_ID, model, caps, choice.candidate.files)
    if refusal is not None:
        return refusal
    from anyformer_diskformer.arch.registry import find_spec
    from anyformer_diskformer.plan import (
        PROMPT_STEP,
        RAM_OVERHEAD,
        context_for,
        plan_for,
        plan_from_summary,
        plan_from_tensor_bytes,
        rough_plan,
    )

    wanted = request.options.get("device", "auto")
    device = "gpu" if caps.gpu and wanted in ("auto", "gpu") else "cpu"
    context = context_for(summary, request.context)
    step = request.options.get("prompt_step", PROMPT_STEP)
    # A bad value is the load's BAD_REQUEST; the check sizes with the default meanwhile.
    step = step if isinstance(step, int) and not isinstance(step, bool) and step >= 1 else PROMPT_STEP
    if choice.estimated:
        plan = rough_plan(summary, choice.size, context, device, step)
    elif (
        (spec := find_spec(summary.get("architecture"))) is not None and spec.per_layer_state and file.path is not None
    ):
        # Gemma 4's and qwen35moe's per-layer state is sized from the header's keys, which the summary does
        # not carry: a local file's header (validated and cached by describe) is read again for it.
        plan = plan_for(file.path, summary, context, device, step)
    else:
        plan = plan_from_tensor_bytes(summary, context, device, step) or plan_from_summary(
            summary, context, device, step
        )
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
    from anyformer_diskformer.speed import gpu_tok_per_sec, tok_per_sec

    if device == "gpu":
        speed, speed_model = gpu_tok_per_sec(file.path, plan, cache, summary)
    else:
        speed, speed_model = tok_per_sec(file.path, plan, cache, device)
    return Verdict.accept(
        BACKEND_ID,
        Estimate(
            gpu_bytes=held if device == "gpu" else 0,
            ram_bytes=RAM_OVERHEAD if device == "gpu" else held,
            disk_bytes=choice.size,
            tok_per_sec=speed,
            rank=Rank.SPECIALIST,
            details={
                "file": file.name,
                "quant": choice.candidate.quant,
                "shards": len(choice.names),
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
            files=choice.names,
            inputs=(),
        ),
    )
