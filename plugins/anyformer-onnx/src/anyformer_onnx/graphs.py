"""Which ONNX graph of a repo a load reads: the known file layouts, precisions and external data.

Exporters put graphs at a few known paths: optimum writes ``model.onnx`` or
``decoder_model_merged.onnx`` at the top; transformers.js repos keep them under ``onnx/`` with one
file per precision (``model_q4.onnx``, ``model_fp16.onnx``…). A graph over 2 GB keeps its weights
in external data beside it (``model.onnx_data``, ``model.onnx.data``, ``model.onnx_data_1``…).
Everything here works on the description's names and sizes, so ``can_run`` reads no file.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from anyformer.plugin import Model, ModelFile
from anyformer_onnx.chat.per_layer import declares_per_layer_inputs, per_layer_encoders

#: Precision suffixes of transformers.js exports, and what each means.
PRECISIONS: dict[str, str] = {
    "": "fp32",
    "_fp16": "fp16",
    "_q4": "q4",
    "_q4f16": "q4f16",
    "_int8": "int8",
    "_uint8": "uint8",
    "_quantized": "int8",
    "_bnb4": "bnb4",
}

# Preference by execution provider, best first. On the CPU fp16 is slower than fp32 (onnxruntime
# converts most fp16 kernels back to fp32) and q4f16 mixes both, so they come last.
_ORDER: dict[str, tuple[str, ...]] = {
    "cpu": ("_q4", "_quantized", "_int8", "_uint8", "", "_bnb4", "_q4f16", "_fp16"),
    "cuda": ("_fp16", "_q4f16", "", "_q4", "_quantized", "_int8", "_uint8", "_bnb4"),
}

#: Graph stems by task family: decoders (chat) and single-graph encoders (embeddings, classifiers).
DECODER_STEMS = ("model", "decoder_model_merged")
ENCODER_STEMS = ("model",)
#: The graphs of a speech encoder-decoder in optimum's split layout, all three needed, in this order.
SPEECH_STEMS = ("encoder_model", "decoder_model", "decoder_with_past_model")
#: The text graphs of a multimodal chat export with one graph per module, both needed.
CHAT_MODULE_STEMS = ("embed_tokens", "decoder_model_merged")
#: The media encoders such an export may have beside them: at least one; every one the repo has is read.
MEDIA_ENCODER_STEMS = ("vision_encoder", "audio_encoder")
#: Graphs of a repo with one graph per module (a multimodal chat model); ``speech_encoder`` is not read.
MODULE_STEMS = ("embed_tokens", "vision_encoder", "audio_encoder", "speech_encoder")

#: Graph names that are one part of a split export, never a whole model on their own.
SPLIT_PARTS = ("encoder_model", "decoder_model", "decoder_with_past_model", *MODULE_STEMS)

_FOLDERS = ("onnx/", "")
_DATA_SUFFIX = re.compile(r"^(?:_data|\.data|_data_\d+|\.data_\d+)$")


@dataclasses.dataclass(frozen=True)
class GraphChoice:
    """One graph a load will open: its file, its external data, and its precision."""

    graph: ModelFile
    data: tuple[ModelFile, ...]
    precision: str

    @property
    def files(self) -> tuple[str, ...]:
        """The repo file names a load reads for this graph."""
        return (self.graph.name, *(f.name for f in self.data))

    @property
    def size(self) -> int:
        """Bytes of the graph and its external data (0 where a size is unknown)."""
        return (self.graph.size or 0) + sum(f.size or 0 for f in self.data)


def external_data_of(model: Model, graph: ModelFile) -> tuple[ModelFile, ...]:
    """The files beside ``graph`` named as its external data (``<graph>.onnx_data``, ``.onnx.data``, ``_data_N``)."""
    prefix = graph.name
    found = []
    for entry in model.files:
        if entry is graph or not entry.name.startswith(prefix):
            continue
        if _DATA_SUFFIX.match(entry.name[len(prefix) :]):
            found.append(entry)
    return tuple(found)


def candidates(model: Model, stems: Sequence[str]) -> list[tuple[str, ModelFile]]:
    """Every graph at a known path for these stems, as ``(precision suffix, file)``, in listing order."""
    by_name = {f.name: f for f in model.files}
    found: list[tuple[str, ModelFile]] = []
    for folder in _FOLDERS:
        for stem in stems:
            for suffix in PRECISIONS:
                entry = by_name.get(f"{folder}{stem}{suffix}.onnx")
                if entry is not None:
                    found.append((suffix, entry))
    return found


def single_graph(model: Model) -> GraphChoice | None:
    """For a model given as one ``.onnx`` file (``describe my-export.onnx``): that graph.

    Not when its name says it is one part of a split export (``encoder_model.onnx``,
    ``vision_encoder.onnx``…): the other parts are missing.
    """
    graphs = model.files_of("onnx")
    if len(graphs) != 1:
        return None
    graph = graphs[0]
    stem = graph.name.rsplit("/", 1)[-1].removesuffix(".onnx")
    if any(stem.startswith(part) for part in SPLIT_PARTS):
        return None
    return GraphChoice(graph, external_data_of(model, graph), _precision_of(graph.name))


def _precision_of(name: str) -> str:
    stem = name.rsplit("/", 1)[-1].removesuffix(".onnx")
    for suffix in sorted(PRECISIONS, key=len, reverse=True):
        if suffix and stem.endswith(suffix):
            return PRECISIONS[suffix]
    return "fp32"


def choose_graph(model: Model, stems: Sequence[str], device: str, wanted: str | None = None) -> GraphChoice | None:
    """The graph to load for ``device`` (``cpu``/``cuda``): ``wanted`` precision if present, else the best.

    Falls back to the model's only ONNX file when none sits at a known path, so a single exported
    file described on its own still loads. None when nothing fits.
    """
    found = candidates(model, stems)
    if not found:
        return single_graph(model)
    order = _ORDER.get(device, _ORDER["cpu"])
    if wanted is not None:
        matching = [(s, f) for s, f in found if PRECISIONS[s] == wanted or s.lstrip("_") == wanted]
        if not matching:
            return None
        found = matching
    suffix, graph = min(found, key=lambda item: order.index(item[0]))
    return GraphChoice(graph, external_data_of(model, graph), PRECISIONS[suffix])


@dataclasses.dataclass(frozen=True)
class GraphSet:
    """Several graphs one load opens together (an encoder-decoder's parts), all of one precision."""

    parts: tuple[GraphChoice, ...]

    @property
    def graph(self) -> ModelFile:
        """The first part's graph (the one named in an estimate's details)."""
        return self.parts[0].graph

    @property
    def data(self) -> tuple[ModelFile, ...]:
        """Every part's external data files."""
        return tuple(f for part in self.parts for f in part.data)

    @property
    def precision(self) -> str:
        """The precision every part shares."""
        return self.parts[0].precision

    @property
    def files(self) -> tuple[str, ...]:
        """The repo file names a load reads for every part."""
        return tuple(name for part in self.parts for name in part.files)

    @property
    def size(self) -> int:
        """Bytes of every part and its external data."""
        return sum(part.size for part in self.parts)


def choose_graph_set(model: Model, stems: Sequence[str], device: str, wanted: str | None = None) -> GraphSet | None:
    """One graph per stem, all of the same precision suffix and folder, the best precision for ``device`` first."""
    by_name = {f.name: f for f in model.files}
    for suffix in _ORDER.get(device, _ORDER["cpu"]):
        if wanted is not None and PRECISIONS[suffix] != wanted and suffix.lstrip("_") != wanted:
            continue
        for folder in _FOLDERS:
            found = [by_name.get(f"{folder}{stem}{suffix}.onnx") for stem in stems]
            graphs = [f for f in found if f is not None]
            if len(graphs) == len(stems):
                return GraphSet(tuple(GraphChoice(f, external_data_of(model, f), PRECISIONS[suffix]) for f in graphs))
    return None


def media_encoders(model: Model) -> tuple[str, ...]:
    """The media encoder stems (``vision_encoder``, ``audio_encoder``) the repo has a graph for, at any precision.

    For a decoder with per-layer inputs (:mod:`chat.per_layer`), only those read beside it (Gemma 4's vision encoder).
    """
    stems = per_layer_encoders(model.config) if declares_per_layer_inputs(model.config) else MEDIA_ENCODER_STEMS
    return tuple(stem for stem in stems if candidates(model, [stem]))


def media_chat_stems(model: Model) -> tuple[str, ...]:
    """The graphs a multimodal chat load opens, in this order: embed_tokens, the decoder, then each encoder."""
    return (*CHAT_MODULE_STEMS, *media_encoders(model))


def module_graphs(model: Model) -> list[str]:
    """Names of per-module graphs (``vision_encoder``, ``embed_tokens``…): a multimodal chat export."""
    return [f.name for _, f in candidates(model, MODULE_STEMS)]
