"""The task registry is the one source of the tasks this backend runs: can_run and load ask it alone.

A new task is one family module plus one line in ``FAMILY_MODULES``: the last tests add a family that
way (a module under ``anyformer_onnx.tasks``, no other edit) and watch can_run accept its task, task_of
read its architecture suffix, and load open its handle through its loader.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
from collections.abc import Iterator
from typing import Any, cast

import pytest

from anyformer.plugin import BackendModel, Caps, Model, ProgressEvent, Refusal, Request, Verdict
from anyformer_onnx import plugin
from anyformer_onnx.graphs import GraphChoice, choose_graph
from anyformer_onnx.loading import open_model
from anyformer_onnx.tasks import registry
from anyformer_onnx.tasks.family import Graphs, TaskFamily, known_paths

CAPS = Caps(ram_bytes=16 * 10**9, store=True, cpu_count=2)
FILL_MASK = "fill-mask"
_MODULES = [("onnx/embed_tokens.onnx", 10**6), ("onnx/decoder_model_merged.onnx", 10**6)]


def _model(files: list[tuple[str, int]], **fields: Any) -> Model:
    data = {"repo": "org/m", "files": [{"name": n, "size": s} for n, s in files], **fields}
    config = data.pop("config", {})
    model = Model.from_dict(data)
    return Model(**{**model.__dict__, "config": config})


def _verdict(model: Model, **request: Any) -> Verdict:
    return plugin.can_run(model=model, caps=CAPS, request=Request.build(**request))


@pytest.fixture
def fresh_registry() -> Iterator[None]:
    """The registry's cache emptied before and after: a test may change ``FAMILY_MODULES``."""
    registry.families.cache_clear()
    yield
    registry.families.cache_clear()


def test_each_registered_module_holds_its_family() -> None:
    for name in registry.FAMILY_MODULES:
        family = importlib.import_module(f"anyformer_onnx.tasks.{name}").FAMILY
        assert isinstance(family, TaskFamily) and family.name == name and family.tasks
    assert registry.tasks() == tuple(dict.fromkeys(task for family in registry.families() for task in family.tasks))


def test_each_task_is_run_by_a_family_that_answers_it() -> None:
    flat = _model([("onnx/model.onnx", 10**6)])
    modular = _model([*_MODULES, ("onnx/vision_encoder.onnx", 10**6)])
    for family in registry.families():
        for task in family.tasks:
            chosen = registry.family_for(modular if family.modules else flat, task)
            assert chosen is family, f"{task} on a {'modular' if family.modules else 'flat'} repo: {chosen}"


def test_a_task_outside_the_registry_is_refused_naming_every_registered_task() -> None:
    verdict = _verdict(_model([("onnx/model.onnx", 10**6)]), task=FILL_MASK)
    assert not verdict.ok and verdict.code == Refusal.TASK
    assert verdict.reason.endswith(", ".join(registry.tasks()))


def test_a_family_left_out_of_the_registry_is_not_run(monkeypatch: pytest.MonkeyPatch, fresh_registry: None) -> None:
    files = [("onnx/model.onnx", 10**6), ("tokenizer.json", 10), ("preprocessor_config.json", 10)]
    model = _model(files, config={"architectures": ["ViTForImageClassification"]})
    assert _verdict(model).ok
    without_vision = tuple(name for name in registry.FAMILY_MODULES if name != "vision")
    monkeypatch.setattr(registry, "FAMILY_MODULES", without_vision)
    registry.families.cache_clear()
    verdict = _verdict(model, task="image-classification")
    assert not verdict.ok and verdict.code == Refusal.TASK
    assert "image-classification" not in registry.tasks()


class _Handle:
    """What the added family's loader opens: it keeps what the loader was given."""

    task = FILL_MASK

    def __init__(self, graphs: Graphs, provider: str) -> None:
        self.graphs = graphs
        self.provider = provider


def _open_fill_mask(
    model: Model, request: Request, progress: Any, task: str, graphs: Graphs, provider: str
) -> BackendModel:
    assert task == FILL_MASK
    progress(ProgressEvent(stage="load", backend="onnx", file=graphs.graph.name))
    return cast(BackendModel, _Handle(graphs, provider))


@pytest.fixture
def fill_mask_family(monkeypatch: pytest.MonkeyPatch, fresh_registry: None) -> TaskFamily:
    """A family module added as a new task is: ``anyformer_onnx.tasks.fill_mask`` and one registry line."""
    family = TaskFamily(
        name="fill_mask",
        tasks=(FILL_MASK,),
        choose=lambda model, device, wanted: choose_graph(model, ("model",), device, wanted),
        graph_paths=known_paths(("model",)),
        open=_open_fill_mask,
        architectures=(("ForMaskedLM", FILL_MASK),),
    )
    module = types.ModuleType("anyformer_onnx.tasks.fill_mask")
    module.FAMILY = family  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(registry, "FAMILY_MODULES", (*registry.FAMILY_MODULES, "fill_mask"))
    return family


def test_a_new_family_is_one_registry_line_and_its_module(fill_mask_family: TaskFamily) -> None:
    model = _model([("onnx/model_q4.onnx", 10**6)], config={"architectures": ["BertForMaskedLM"]})
    assert FILL_MASK in registry.tasks()
    assert registry.task_of(model, None) == FILL_MASK
    estimate = _verdict(model).estimate
    assert estimate is not None and estimate.details["task"] == FILL_MASK
    assert estimate.details["file"] == "onnx/model_q4.onnx"
    events: list[ProgressEvent] = []
    handle = open_model(model, Request.build(), events.append)
    assert isinstance(handle, _Handle) and isinstance(handle.graphs, GraphChoice)
    assert handle.graphs.graph.name == "onnx/model_q4.onnx" and events[0].file == "onnx/model_q4.onnx"


def test_a_new_family_without_its_graph_is_refused_naming_its_paths(fill_mask_family: TaskFamily) -> None:
    verdict = _verdict(_model([("onnx/encoder.onnx", 10**6), ("onnx/head.onnx", 10**6)]), task=FILL_MASK)
    assert not verdict.ok and verdict.code == Refusal.FORMAT
    assert fill_mask_family.graph_paths in verdict.reason


def test_asking_the_registry_imports_no_engine() -> None:
    """can_run reads the families' declarations only: numpy and onnxruntime load with a loader."""
    probe = (
        "import sys; from anyformer_onnx import plugin; from anyformer_onnx.tasks.registry import families; "
        "families(); print(sorted(m for m in ('numpy', 'onnxruntime', 'onnx', 'tokenizers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "[]"
