"""Which task family runs a model: the one table of the tasks this backend runs.

A new task is one module under ``tasks/`` holding a :class:`~anyformer_onnx.tasks.family.TaskFamily`
named ``FAMILY`` (its tasks, graphs, files, refusals and loader) plus one line in
:data:`FAMILY_MODULES`; ``plugin.py``, ``loading.py`` and ``estimate.py`` ask this table and need
no edit. ``tests/test_task_registry.py`` checks that every task ``can_run`` accepts comes from here.

The order is the order families are asked: for a task two families answer, the one whose
``modules`` fits the repo's layout runs it; for a repo whose request names no task, the first
family whose ``decides`` or ``guess`` has an opinion sets it (speech before chat: a Whisper repo
holds a ``decoder_model_merged`` too; multimodal chat before chat: so does a multimodal export).
"""

from __future__ import annotations

import functools
import importlib

from anyformer.plugin import Model
from anyformer_onnx.graphs import module_graphs
from anyformer_onnx.tasks.family import TaskFamily
from anyformer_onnx.tasks.names import TEXT_GENERATION

#: The family modules under ``anyformer_onnx.tasks``, in the order they are asked: one line each.
FAMILY_MODULES = (
    "embeddings",
    "speech",
    "media_chat",
    "chat",
    "classification",
    "vision",
)


@functools.cache
def families() -> tuple[TaskFamily, ...]:
    """Every registered family, its module imported (light modules: the loaders import the engines)."""
    found = []
    for name in FAMILY_MODULES:
        family = getattr(importlib.import_module(f"anyformer_onnx.tasks.{name}"), "FAMILY", None)
        if not isinstance(family, TaskFamily):
            raise TypeError(f"anyformer_onnx.tasks.{name} holds no TaskFamily named FAMILY")
        found.append(family)
    return tuple(found)


def tasks() -> tuple[str, ...]:
    """Every task this backend runs, each once, in the families' order."""
    return tuple(dict.fromkeys(task for family in families() for task in family.tasks))


def family_for(model: Model, task: str) -> TaskFamily | None:
    """The family that runs ``task`` on this repo (None: no family answers the task).

    Where several answer it, the one reading the repo's layout (one graph per module or not) runs
    it; where none reads that layout, the first that answers the task, whose refusal then says why.
    """
    answering = [family for family in families() if task in family.tasks]
    modules = bool(module_graphs(model))
    return next((family for family in answering if family.modules == modules), next(iter(answering), None))


def task_of(model: Model, requested: str | None) -> str:
    """The task to run: the request's, the model's own, else one read from its tags, files and config."""
    if requested:
        return requested
    decided = next((task for family in families() if (task := family.decides(model))), None)
    if decided:
        return decided
    if model.task:
        return model.task
    guessed = next((task for family in families() if (task := family.guess(model))), None)
    if guessed:
        return guessed
    architectures = model.config.get("architectures")
    if isinstance(architectures, list):
        suffixes = sorted(
            (pair for family in families() for pair in family.architectures), key=lambda pair: -len(pair[0])
        )
        for name in architectures:
            if not isinstance(name, str):
                continue
            for suffix, task in suffixes:
                if name.endswith(suffix):
                    return task
    return TEXT_GENERATION
