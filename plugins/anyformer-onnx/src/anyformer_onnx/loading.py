"""``load``: the task's family, the provider and graphs it runs on, then the family's loader opens the handle.

Imported by the ``load`` hook only. Nothing here names a task: :mod:`anyformer_onnx.tasks.registry`
says which family runs which, and each family's loader fetches, validates and opens its handle.
"""

from __future__ import annotations

from anyformer.plugin import AnyformerError, BackendModel, ErrorCode, Model, ProgressCallback, Request
from anyformer_onnx.load_options import string_option
from anyformer_onnx.session.providers import CUDA, available_providers, choose_provider
from anyformer_onnx.tasks.registry import family_for, task_of, tasks


def open_model(model: Model, request: Request, progress: ProgressCallback) -> BackendModel:
    """Fetch, validate and open ``model`` for its task: the handle its task family opens."""
    task = task_of(model, request.task)
    family = family_for(model, task)
    if family is None:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"task {task}; the onnx backend runs {', '.join(tasks())}")
    wanted_provider = {"cuda": CUDA, "cpu": "CPUExecutionProvider", None: None}.get(string_option(request, "provider"))
    provider = choose_provider(available_providers(), wanted_provider)
    device = "cuda" if provider == CUDA else "cpu"
    graphs = family.choose(model, device, string_option(request, "precision"))
    if graphs is None:
        raise AnyformerError(
            ErrorCode.NO_BACKEND, f"{model.ref}: no {task} graph at a known path ({family.graph_paths})"
        )
    return family.open(model, request, progress, task, graphs, provider)
