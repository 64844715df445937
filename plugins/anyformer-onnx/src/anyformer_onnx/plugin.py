"""The anyformer hooks of the ONNX backend. Nothing heavy is imported here: onnxruntime loads in ``load``."""

from __future__ import annotations

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
from anyformer_onnx import BACKEND_ID
from anyformer_onnx.estimate import context_for, kv_cache_bytes, memory_need
from anyformer_onnx.graphs import media_encoders, module_graphs
from anyformer_onnx.session.providers import CUDA, INSTALL_HINT, expected_provider, onnxruntime_installed
from anyformer_onnx.tasks.chat_media import MEDIA_INPUTS
from anyformer_onnx.tasks.family import Graphs
from anyformer_onnx.tasks.registry import family_for, task_of, tasks

#: Tags of models another engine runs: text diffusion decodes by unmasking, not left to right.
FOREIGN_TAGS = ("text-diffusion",)


def plan(model: Model, caps: Caps, request: Request) -> tuple[str, Graphs | None, str]:
    """The task, the graphs a load reads and the expected provider.

    The graphs are None where none is at a known path, or where no family answers the task.
    """
    task = task_of(model, request.task)
    provider = expected_provider(caps.gpu)
    device = "cuda" if provider == CUDA else "cpu"
    wanted = request.options.get("precision")
    family = family_for(model, task)
    choice = family.choose(model, device, wanted if isinstance(wanted, str) else None) if family else None
    return task, choice, provider


@hookimpl
def can_run(model: Model, caps: Caps, request: Request) -> Verdict:
    """Refuse with ``format``/``model``/``task``/``budget``/``memory``/``runtime``, or estimate the load."""
    if "onnx" not in model.formats:
        return Verdict.refuse(BACKEND_ID, Refusal.FORMAT, "no .onnx file in the repo")
    foreign = [tag for tag in FOREIGN_TAGS if tag in model.tags]
    if foreign:
        return Verdict.refuse(
            BACKEND_ID, Refusal.MODEL, f"tagged {foreign[0]}: it decodes by unmasking, not with a KV cache"
        )
    task, choice, provider = plan(model, caps, request)
    family = family_for(model, task)
    if family is None:
        return Verdict.refuse(BACKEND_ID, Refusal.TASK, f"task {task}; this backend runs {', '.join(tasks())}")
    modules = module_graphs(model)
    if modules and not family.modules:
        return Verdict.refuse(BACKEND_ID, Refusal.MODEL, f"one graph per module ({modules[0]}…): read for chat only")
    problem = family.problem(model, task, choice)
    if problem is not None:
        return Verdict.refuse(BACKEND_ID, *problem)
    if choice is None:
        wanted = request.options.get("precision")
        which = f"{wanted} " if isinstance(wanted, str) else ""
        where = family.graph_paths
        return Verdict.refuse(BACKEND_ID, Refusal.FORMAT, f"no {which}{task} graph at a known path ({where})")
    on_gpu = provider == CUDA
    chat = family.decoder
    text_config = model.config.get("text_config")
    # A multimodal config nests its decoder's shapes under text_config.
    config = text_config if isinstance(text_config, dict) else model.config
    context = context_for(config, request.context) if chat else 0
    kv = kv_cache_bytes(config, context, 2 if on_gpu else 4) if chat else 0
    need = memory_need(choice.size, kv)
    details = {
        "file": choice.graph.name,
        "precision": choice.precision,
        "external_data": len(choice.data),
        "provider": provider,
        "task": task,
    }
    if chat:
        details["context"] = context
        details["inputs"] = ["text", *(MEDIA_INPUTS[stem] for stem in media_encoders(model))]
    if on_gpu:
        budget = request.budget_or(caps.gpu_bytes)
        if need > budget:
            return Verdict.refuse(
                BACKEND_ID,
                Refusal.BUDGET,
                f"{choice.graph.name}: needs {format_size(need)} of GPU memory (graph and external data "
                f"{format_size(choice.size)}, KV cache {format_size(kv)}); budget {format_size(budget)}",
                need=need,
            )
    # On the GPU the host still holds the weights while the session copies them over.
    host = memory_need(choice.size, 0) if on_gpu else need
    if host > caps.ram_bytes:
        return Verdict.refuse(
            BACKEND_ID,
            Refusal.MEMORY,
            f"{choice.graph.name}: needs {format_size(host)} of host memory (graph and external data "
            f"{format_size(choice.size)}, KV cache {format_size(kv)}); {format_size(caps.ram_bytes)} available",
            need=host,
        )
    if not onnxruntime_installed():
        return Verdict.refuse(BACKEND_ID, Refusal.RUNTIME, f"onnxruntime is not installed: {INSTALL_HINT}")
    return Verdict.accept(
        BACKEND_ID,
        Estimate(
            gpu_bytes=need if on_gpu else 0,
            ram_bytes=host,
            disk_bytes=choice.size,
            rank=Rank.GENERAL,
            details=details,
            files=choice.files,
        ),
    )


@hookimpl
def load(model: Model, request: Request, progress: ProgressCallback) -> BackendModel:
    """Fetch and validate the chosen graph, then open it with onnxruntime."""
    from anyformer_onnx.loading import open_model  # imports onnxruntime

    return open_model(model, request, progress)


@hookimpl
def store_list() -> list[StoreEntry]:
    """The decoder graphs this backend fused on a first load, kept under ``ANYFORMER_HOME/onnx``."""
    from anyformer_onnx.rewrite.fused_store import fused_entries

    return fused_entries()
