"""What one task family declares: the tasks it answers, the graphs and files it reads, why a model
does not fit, and its loader.

A family module (``tasks/chat.py``, ``tasks/speech.py``…) holds one :class:`TaskFamily` named
``FAMILY``, and :mod:`anyformer_onnx.tasks.registry` lists the module. ``can_run`` asks the
declaration only (the description's names, sizes and config.json: no file is read, nothing heavy
is imported); ``load`` calls ``open``, which imports what it needs (numpy, onnxruntime) when it runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from anyformer.plugin import BackendModel, Model, ProgressCallback, Refusal, Request
from anyformer_onnx.graphs import GraphChoice, GraphSet

#: The graphs a load reads: one graph, or for a split export the set of them.
Graphs = GraphChoice | GraphSet
#: Why a model's files or config do not fit a task, as the refusal ``can_run`` gives; None when they do.
Problem = tuple[Refusal, str] | None
#: ``open(model, request, progress, task, graphs, provider)``: fetch, validate and open the handle.
Loader = Callable[[Model, Request, ProgressCallback, str, Graphs, str], BackendModel]


def _no_problem(_model: Model, _task: str, _graphs: Graphs | None) -> Problem:
    return None


def _no_task(_model: Model) -> str | None:
    return None


def known_paths(stems: Sequence[str], *, all_of: bool = False) -> str:
    """Where a family looks for its graphs, as a refusal names them (``[onnx/]model[_q4|_fp16|…].onnx``)."""
    where = ", ".join(f"[onnx/]{stem}[_q4|_fp16|…].onnx" for stem in stems)
    return f"all of {where}, of one precision" if all_of else where


@dataclasses.dataclass(frozen=True)
class TaskFamily:
    """One family of tasks this backend runs, and everything ``can_run`` and ``load`` ask of it."""

    #: The family's name, as a module of ``tasks/`` is named.
    name: str
    #: The Hub task names it answers (``text-generation``, ``image-classification``…).
    tasks: tuple[str, ...]
    #: The graphs a load reads, for the model on this device (``cuda`` or ``cpu``), of the wanted
    #: precision (None: the device's best); None when none is at a known path.
    choose: Callable[[Model, str, str | None], Graphs | None]
    #: Where its graphs are looked for, named in the refusal when none is found.
    graph_paths: str
    #: The loader: fetch the graphs and :attr:`files`, validate them, open the handle.
    open: Loader
    #: Files it reads beside the graphs when the repo has them (fetched with the graphs).
    files: tuple[str, ...] = ()
    #: Why a model does not fit one of its tasks, read from the description and the graphs chosen
    #: (None when it does). Without graphs (None) and no problem, the refusal names :attr:`graph_paths`.
    problem: Callable[[Model, str, Graphs | None], Problem] = _no_problem
    #: True for a family that reads exports with one graph per module (``embed_tokens``, ``vision_encoder``…);
    #: such a repo is read by these families only.
    modules: bool = False
    #: True when it decodes with a KV cache: the estimate counts the cache at the request's context.
    decoder: bool = False
    #: The task a repo's layout always runs, asked before the repo's own pipeline tag (None: no opinion).
    decides: Callable[[Model], str | None] = _no_task
    #: The task a repo's tags and files say, asked after its pipeline tag (None: no opinion).
    guess: Callable[[Model], str | None] = _no_task
    #: config.json ``architectures`` suffixes and the task each means (the longest matching suffix wins).
    architectures: tuple[tuple[str, str], ...] = ()
