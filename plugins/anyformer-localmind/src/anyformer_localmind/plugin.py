"""The anyformer hooks of the LocalMind backend. Nothing heavy is imported here: wgpu loads in ``load``.

``can_run`` decides from the description alone (the core read the GGUF's header): the format, the
task, whether an engine reads the architecture, every weight type and the tokenizer, whether there
is a GPU adapter, and whether weights plus the KV cache plus the engine's buffers fit the budget.
"""

from __future__ import annotations

import importlib.util
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
from anyformer_gguf_gpu.model_choice import gguf_refusal, store_refusal, tokenizer_problem
from anyformer_gguf_gpu.split_set import partial_set_refusal
from anyformer_localmind import BACKEND_ID
from anyformer_localmind.estimate import MAX_BATCH, RAM_OVERHEAD, context_for

INSTALL_HINT = "pip install wgpu"


def _header_problem(summary: dict[str, object]) -> str | None:
    """Why no engine reads this GGUF (architecture, weight types, tokenizer), or None."""
    from anyformer_gguf_gpu.config import architecture_problem

    problem = architecture_problem(summary)
    if problem is not None:
        return problem
    return tokenizer_problem(summary)


@hookimpl
def can_run(model: Model, caps: Caps, request: Request) -> Verdict:
    """Refuse with ``format``/``task``/``model``/``gpu``/``store``/``budget``/``memory``/``runtime``, or estimate."""
    partial = partial_set_refusal(BACKEND_ID, model)
    if partial is not None:
        return partial
    choice = gguf_refusal(BACKEND_ID, model, request, _header_problem)
    if isinstance(choice, Verdict):
        return choice
    if not caps.gpu:
        note = f" ({caps.gpu_note})" if caps.gpu_note else ""
        return Verdict.refuse(BACKEND_ID, Refusal.GPU, f"needs a GPU adapter through wgpu{note}")
    refusal = store_refusal(BACKEND_ID, model, caps, choice.file)
    if refusal is not None:
        return refusal
    from anyformer_gguf_gpu.engines import engine_footprint

    context = context_for(choice.summary, request.context)
    # The engine keeps an f16 KV cache where the adapter has shader-f16.
    plan = engine_footprint(choice.summary, context, MAX_BATCH, kv_f16=caps.f16)
    budget = request.budget if request.budget is not None else caps.gpu_bytes
    if budget is not None and plan.gpu_bytes > budget:
        return Verdict.refuse(
            BACKEND_ID,
            Refusal.BUDGET,
            f"{choice.file.name}: needs {format_size(plan.gpu_bytes)} of GPU memory at {context} tokens of context "
            f"(weights {format_size(plan.weights_bytes)}, KV cache {format_size(plan.kv_bytes)}, "
            f"buffers {format_size(plan.buffer_bytes)}); the budget is {format_size(budget)}",
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
    return Verdict.accept(
        BACKEND_ID,
        Estimate(
            gpu_bytes=plan.gpu_bytes,
            ram_bytes=RAM_OVERHEAD,
            disk_bytes=choice.file.size or 0,
            rank=Rank.SPECIALIST,
            details={
                "file": choice.file.name,
                "architecture": choice.summary.get("architecture"),
                "context": context,
                "kv_cache": plan.kv_bytes,
                "adapter": caps.gpu_name,
            },
            files=(choice.file.name,),
        ),
    )


@hookimpl
def load(backend: str, model: Model, request: Request, progress: ProgressCallback) -> BackendModel | None:
    """Fetch the GGUF, upload every weight as its raw blocks and compile every kernel."""
    if backend != BACKEND_ID:
        return None
    from anyformer_localmind.engine import LocalMindModel  # imports wgpu

    return LocalMindModel.open(model, request, progress)


@hookimpl
def generate(loaded: BackendModel, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk] | None:
    """Stream a chat reply from a model this backend loaded."""
    if loaded.backend != BACKEND_ID:
        return None
    from anyformer_localmind.engine import LocalMindModel

    assert isinstance(loaded, LocalMindModel)
    return loaded.stream(messages, options)


@hookimpl
def store_list() -> list[StoreEntry]:
    """Nothing: the GGUFs live in the Hugging Face cache (listed by the core); nothing is derived."""
    return []
