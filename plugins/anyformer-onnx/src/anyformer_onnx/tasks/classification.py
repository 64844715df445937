"""Text and token classification from an encoder graph with a classification head (``logits``)."""

from __future__ import annotations

from anyformer.plugin import BackendModel, Model, ProgressCallback, Request
from anyformer_onnx.graphs import ENCODER_STEMS, GraphChoice, choose_graph
from anyformer_onnx.tasks.family import Graphs, TaskFamily, known_paths
from anyformer_onnx.tasks.names import TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION


def _choose(model: Model, device: str, wanted: str | None) -> GraphChoice | None:
    return choose_graph(model, ENCODER_STEMS, device, wanted)


def open_classifier(
    model: Model, request: Request, progress: ProgressCallback, task: str, graphs: Graphs, provider: str
) -> BackendModel:
    """Open the encoder with its tokenizer and config.json's labels."""
    from anyformer_onnx.text.classifier import OnnxClassifierModel
    from anyformer_onnx.text.encoder import EncoderGraph
    from anyformer_onnx.text.text_graph import open_text_graph

    assert isinstance(graphs, GraphChoice)  # this family chooses one graph
    opened = open_text_graph(model, request, progress, graphs, provider)
    encoder = EncoderGraph(opened.session, opened.text.tokenizer, opened.label)
    config = opened.text.config or model.config
    return OnnxClassifierModel(encoder, task=task, config=config, details=opened.details)


FAMILY = TaskFamily(
    name="classification",
    tasks=(TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION),
    choose=_choose,
    graph_paths=known_paths(ENCODER_STEMS),
    open=open_classifier,
    architectures=(
        ("ForSequenceClassification", TEXT_CLASSIFICATION),
        ("ForTokenClassification", TOKEN_CLASSIFICATION),
    ),
)
