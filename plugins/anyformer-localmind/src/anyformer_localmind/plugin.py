"""The anyformer hooks of the LocalMind backend. Nothing heavy is imported here: wgpu loads in ``load``.

``can_run`` decides from the description alone (the header facts of the file it would load come from
the core, read on demand; without them it estimates from the architecture and the file size): the
format, the task, which file (plain Q4_0 first, the next smaller one when one does not fit), whether
an engine reads the architecture, every weight type and the tokenizer, whether there is a GPU
adapter, and whether weights plus the KV cache plus the engine's buffers fit the budget.
"""

from __future__ import annotations

import importlib.util

from anyformer.plugin import (
    BackendModel,
    Caps,
    Estimate,
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
from anyformer_gguf_gpu.model_choice import GgufChoice, choose_and_judge, load_caps
from anyformer_localmind import BACKEND_ID
from anyformer_localmind.estimate import MAX_BATCH, RAM_OVERHEAD, context_for, modelled_speed
from anyformer_localmind.load_options import LOAD_OPTIONS as LOAD_OPTIONS  # the core reads it here

INSTALL_HINT = "pip install wgpu"


#: The order LocalMind tries a repo's files in: plain Q4_0 first (as the original), then the other types
#: its WGSL kernels read, smallest trade-offs first.
PREFERRED_QUANTS = ("Q4_0", "Q4_1", "Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K", "Q8_0", "F16", "BF16", "F32")
#: Names whose weight types the kernels may read; the K-quant mixes (``_L``, ``_XL``) are decided by their header.
READABLE_QUANTS = (*PREFERRED_QUANTS, "Q4_K", "Q5_K", "Q4_K_L", "Q4_K_XL", "Q5_K_L", "Q5_K_XL", "Q6_K_L", "Q6_K_XL")


def model_problem(summary: dict[str, object]) -> str | None:
    """Why no engine runs the summary's model (architecture, weight types, experts), or None."""
    from anyformer_gguf_gpu.config import architecture_problem

    return architecture_problem(summary)


@hookimpl
def can_run(model: Model, caps: Caps, request: Request) -> Verdict:
    """Refuse with ``format``/``task``/``model``/``gpu``/``store``/``budget``/``memory``/``runtime``, or estimate."""
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
    """The verdict on one file: a GPU adapter, the GPU budget, host memory and wgpu (the core checks the store)."""
    if not caps.gpu:
        note = f" ({caps.gpu_note})" if caps.gpu_note else ""
        return Verdict.refuse(BACKEND_ID, Refusal.GPU, f"needs a GPU adapter through wgpu{note}")
    from anyformer_gguf_gpu.engines import engine_footprint

    context = context_for(choice.summary, request.context)
    # The engine keeps an f16 KV cache where the adapter has shader-f16.
    plan = engine_footprint(choice.summary, context, MAX_BATCH, kv_f16=caps.f16)
    rough = " (a rough estimate from the file size: no header read)" if choice.estimated else ""
    budget = request.budget if request.budget is not None else caps.gpu_bytes
    if budget is not None and plan.gpu_bytes > budget:
        return Verdict.refuse(
            BACKEND_ID,
            Refusal.BUDGET,
            f"{choice.file.name}: needs {format_size(plan.gpu_bytes)} of GPU memory at {context} tokens of context "
            f"(weights {format_size(plan.weights_bytes)}, KV cache {format_size(plan.kv_bytes)}, "
            f"buffers {format_size(plan.buffer_bytes)}){rough}; the budget is {format_size(budget)}",
            need=plan.gpu_bytes,
        )
    if caps.ram_bytes < RAM_OVERHEAD:
        return Verdict.refuse(
            BACKEND_ID,
            Refusal.MEMORY,
            f"needs {format_size(RAM_OVERHEAD)} of host memory besides the GPU's; "
            f"{format_size(caps.ram_bytes)} available",
            need=RAM_OVERHEAD,
        )
    if importlib.util.find_spec("wgpu") is None:
        return Verdict.refuse(BACKEND_ID, Refusal.RUNTIME, f"wgpu is not installed: {INSTALL_HINT}")
    speed, speed_model = modelled_speed(choice.summary, caps, estimated=choice.estimated)
    return Verdict.accept(
        BACKEND_ID,
        Estimate(
            gpu_bytes=plan.gpu_bytes,
            ram_bytes=RAM_OVERHEAD,
            disk_bytes=choice.size,
            rank=Rank.SPECIALIST,
            tok_per_sec=speed,
            details={
                "file": choice.file.name,
                "quant": choice.candidate.quant,
                "architecture": choice.summary.get("architecture"),
                "context": context,
                "kv_cache": plan.kv_bytes,
                "adapter": caps.gpu_name,
                "estimated": choice.estimated,
                "tok_per_sec_model": speed_model,
            },
            files=choice.names,
            inputs=(),
        ),
    )


@hookimpl
def load(model: Model, request: Request, progress: ProgressCallback) -> BackendModel:
    """Fetch the GGUF, upload every weight as its raw blocks and compile every kernel."""
    from anyformer_localmind.engine import LocalMindModel  # imports wgpu

    # The engine takes the file this verdict chose: handed over, so that the engine never imports these hooks.
    return LocalMindModel.open(model, request, progress, can_run(model, load_caps(request, gpu=True), request))


@hookimpl
def store_list() -> list[StoreEntry]:
    """Nothing: the GGUFs live in the Hugging Face cache (listed by the core); nothing is derived."""
    return []
