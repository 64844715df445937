"""The anyformer hooks of the llama.cpp backend. Nothing heavy is imported here: llama_cpp loads in ``load``."""

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
    Verdict,
    format_size,
    hookimpl,
)
from anyformer_llamacpp import BACKEND_ID
from anyformer_llamacpp.estimate import context_for, footprint, measured_speed
from anyformer_llamacpp.file_choice import choose_gguf, projector_for
from anyformer_llamacpp.runtime import INSTALL_HINT, gpu_offload_library, llama_cpp_folder

#: The tasks llama.cpp runs: chat, with images when the repo has a projector, and embeddings (its
#: embedding mode, pooled vectors from ``run``).
TASKS = ("text-generation", "image-text-to-text", "feature-extraction")


@hookimpl
def can_run(model: Model, caps: Caps, request: Request) -> Verdict:
    """Refuse with ``format``/``task``/``model``/``runtime``/``memory``, or estimate where the layers go."""
    if "gguf" not in model.formats:
        return Verdict.refuse(BACKEND_ID, Refusal.FORMAT, "no GGUF in the repo")
    task = request.task or model.task
    if task and task not in TASKS:
        return Verdict.refuse(BACKEND_ID, Refusal.TASK, f"task {task}; llama.cpp runs {', '.join(TASKS)}")
    choice = choose_gguf(model)
    if choice is None:
        return Verdict.refuse(
            BACKEND_ID,
            Refusal.MODEL,
            "no language-model GGUF at a quant llama.cpp reads (projector files and incomplete split sets don't count)",
        )
    if llama_cpp_folder() is None:
        return Verdict.refuse(BACKEND_ID, Refusal.RUNTIME, f"llama_cpp is not installed: {INSTALL_HINT}")
    facts = dict(model.metadata.get("gguf") or {})
    gpu_library = gpu_offload_library()
    budget = request.budget_or(caps.gpu_bytes)
    plan = footprint(
        facts,
        choice.size,
        context=context_for(facts, request.context),
        budget=budget,
        gpu_offload=gpu_library is not None,
    )
    # The projector (mmproj) that reads image blocks is fetched and loaded with the model, except to embed;
    # its bytes count against host memory like the model's own.
    mmproj = projector_for(model) if task != "feature-extraction" else None
    mmproj_files = (mmproj.name,) if mmproj is not None else ()
    mmproj_bytes = (mmproj.size or 0) if mmproj is not None else 0
    ram_bytes = plan.ram_bytes + mmproj_bytes
    if ram_bytes > caps.ram_bytes:
        where = f"{plan.gpu_layers} layers on the GPU and the rest" if plan.gpu_layers else "the model"
        projector = f", projector {format_size(mmproj_bytes)}" if mmproj_bytes else ""
        return Verdict.refuse(
            BACKEND_ID,
            Refusal.MEMORY,
            f"{choice.first.name}: {where} needs {format_size(ram_bytes)} of host memory at {plan.context} tokens "
            f"of context (weights {format_size(plan.weights_bytes)}, KV cache {format_size(plan.kv_bytes)}"
            f"{projector}); {format_size(caps.ram_bytes)} available",
            need=ram_bytes,
        )
    device = gpu_library if plan.full_offload else "cpu"
    speed = measured_speed(model.architecture or facts.get("architecture"), choice.size, device or "cpu")
    return Verdict.accept(
        BACKEND_ID,
        Estimate(
            gpu_bytes=plan.gpu_bytes,
            ram_bytes=ram_bytes,
            disk_bytes=choice.size + mmproj_bytes,
            tok_per_sec=speed,
            rank=Rank.FALLBACK,
            details={
                "file": choice.first.name,
                "quant": choice.quant,
                "shards": len(choice.files),
                "context": plan.context,
                "gpu_layers": plan.gpu_layers,
                "layers": plan.layers,
                "offload": gpu_library or "none (CPU build)",
                "projector": mmproj.name if mmproj is not None else None,
            },
            files=tuple(f.name for f in choice.files) + mmproj_files,
        ),
    )


@hookimpl
def load(backend: str, model: Model, request: Request, progress: ProgressCallback) -> BackendModel | None:
    """Fetch and validate the chosen GGUF, then open it with llama.cpp."""
    if backend != BACKEND_ID:
        return None
    from anyformer_llamacpp.engine import LlamaCppModel  # imports llama_cpp

    return LlamaCppModel.open(model, request, progress)


@hookimpl
def generate(loaded: BackendModel, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk] | None:
    """Stream a chat reply from a model this backend loaded."""
    if loaded.backend != BACKEND_ID:
        return None
    from anyformer_llamacpp.engine import LlamaCppModel

    assert isinstance(loaded, LlamaCppModel)
    return loaded.stream(messages, options)
