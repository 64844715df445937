"""Embeddings from a text encoder graph: one vector per token, pooled as ``1_Pooling/config.json`` says."""

from __future__ import annotations

from anyformer.plugin import BackendModel, Model, ProgressCallback, Request
from anyformer_onnx.graphs import ENCODER_STEMS, GraphChoice, choose_graph
from anyformer_onnx.tasks.family import Graphs, TaskFamily, known_paths
from anyformer_onnx.tasks.names import FEATURE_EXTRACTION, SENTENCE_SIMILARITY

#: sentence-transformers' pooling settings (mean pooling where a repo has none).
POOLING_CONFIG = "1_Pooling/config.json"


def _choose(model: Model, device: str, wanted: str | None) -> GraphChoice | None:
    return choose_graph(model, ENCODER_STEMS, device, wanted)


def _guess(model: Model) -> str | None:
    sentence_transformers = "sentence-transformers" in model.tags or any(f.name == "modules.json" for f in model.files)
    return FEATURE_EXTRACTION if sentence_transformers else None


def open_embedder(
    model: Model, request: Request, progress: ProgressCallback, task: str, graphs: Graphs, provider: str
) -> BackendModel:
    """Open the encoder with its tokenizer and pooling."""
    from anyformer.plugin import read_config_json
    from anyformer_onnx.text.embeddings import OnnxEmbeddingModel, pooling_of
    from anyformer_onnx.text.encoder import EncoderGraph
    from anyformer_onnx.text.text_graph import open_text_graph

    assert isinstance(graphs, GraphChoice)  # this family chooses one graph
    opened = open_text_graph(model, request, progress, graphs, provider, files=FAMILY.files)
    encoder = EncoderGraph(opened.session, opened.text.tokenizer, opened.label)
    pooling_path = opened.paths.get(POOLING_CONFIG)
    pooling = pooling_of(read_config_json(pooling_path, f"{POOLING_CONFIG} of {model.ref}")) if pooling_path else "mean"
    return OnnxEmbeddingModel(encoder, task=task, pooling=pooling, details=opened.details)


FAMILY = TaskFamily(
    name="embeddings",
    tasks=(FEATURE_EXTRACTION, SENTENCE_SIMILARITY),
    choose=_choose,
    graph_paths=known_paths(ENCODER_STEMS),
    open=open_embedder,
    files=(POOLING_CONFIG,),
    guess=_guess,
    architectures=(("Model", FEATURE_EXTRACTION),),
)
