"""Opening one graph read with a tokenizer (a text decoder or encoder): its files, text side and session."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from anyformer.plugin import Model, ProgressCallback, ProgressEvent, Request, fetch_files
from anyformer_onnx import BACKEND_ID
from anyformer_onnx.graphs import GraphChoice
from anyformer_onnx.session.ort_session import open_session
from anyformer_onnx.text.setup import TEXT_FILES, TextSetup, load_text_setup, present_text_files

#: ``rewrite(graph path, text side, label)``: the graph to open instead (a fused copy) and a note for the details.
Rewrite = Callable[[Path, TextSetup, str], tuple[Path, str]]


@dataclasses.dataclass
class TextGraph:
    """A graph opened with its text side: what a chat, embedding or classification handle is built from."""

    session: Any
    text: TextSetup
    #: Local paths of every file fetched, by repo name.
    paths: dict[str, Path]
    label: str
    #: The handle's ``details``: file, precision, provider and, when the graph was rewritten, a note.
    details: dict[str, Any]
    #: The execution provider the session runs on.
    provider: str


def _beside(graph: Path, names: list[str]) -> dict[str, Path]:
    """Text files next to a lone graph file, or one folder up (a graph under ``onnx/``)."""
    found: dict[str, Path] = {}
    for name in names:
        for folder in (graph.parent, graph.parent.parent):
            candidate = folder / name
            if candidate.is_file():
                found[name] = candidate
                break
    return found


def open_text_graph(
    model: Model,
    request: Request,
    progress: ProgressCallback,
    choice: GraphChoice,
    provider: str,
    *,
    files: Sequence[str] = (),
    rewrite: Rewrite | None = None,
) -> TextGraph:
    """Fetch the graph with its text files and the repo's ``files``, read the text side, open the session."""
    extra = present_text_files(model)
    extra += [name for name in files if model.file(name) is not None]
    paths = fetch_files(model, [*choice.files, *extra], progress, backend=BACKEND_ID)
    graph_path = paths[choice.graph.name]
    missing = [name for name in TEXT_FILES if name not in paths]
    if missing and model.file(choice.graph.name) is not None and model.source == "local":
        paths.update(_beside(graph_path, missing))
    progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=choice.graph.name, total=choice.size))
    label = f"{model.ref} ({choice.graph.name})"
    text = load_text_setup(paths, label)
    details: dict[str, Any] = {"file": choice.graph.name, "precision": choice.precision}
    if rewrite is not None:
        graph_path, details["graph"] = rewrite(graph_path, text, label)
    session, actual = open_session(graph_path, provider=provider, threads=request.options.get("threads"))
    progress(
        ProgressEvent(stage="load", backend=BACKEND_ID, file=choice.graph.name, done=choice.size, total=choice.size)
    )
    details["provider"] = actual
    return TextGraph(session, text, paths, label, details, actual)
