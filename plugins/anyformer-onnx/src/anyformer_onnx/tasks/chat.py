"""Chat on a text decoder graph (``model.onnx`` or optimum's ``decoder_model_merged.onnx``) with a KV cache."""

from __future__ import annotations

from pathlib import Path

from anyformer.plugin import BackendModel, Model, ProgressCallback, Request
from anyformer_onnx.graphs import DECODER_STEMS, GraphChoice, choose_graph, media_encoders
from anyformer_onnx.tasks.chat_media import CHAT_TASKS, media_problem
from anyformer_onnx.tasks.family import Graphs, Problem, TaskFamily, known_paths
from anyformer_onnx.tasks.names import TEXT_GENERATION


def _choose(model: Model, device: str, wanted: str | None) -> GraphChoice | None:
    return choose_graph(model, DECODER_STEMS, device, wanted)


def _problem(model: Model, task: str, _graphs: Graphs | None) -> Problem:
    return media_problem(model, task, media_encoders(model))


def _guess(model: Model) -> str | None:
    return TEXT_GENERATION if any("decoder_model_merged" in f.name for f in model.files) else None


def open_chat(
    model: Model, request: Request, progress: ProgressCallback, task: str, graphs: Graphs, provider: str
) -> BackendModel:
    """Open the decoder (on the CPU, its attention fused first unless ``fuse_attention`` is false) and its text side."""
    from anyformer_onnx.chat.decoder import DecoderGraph
    from anyformer_onnx.chat.handle import OnnxChatModel
    from anyformer_onnx.estimate import context_for
    from anyformer_onnx.load_options import fuse_option
    from anyformer_onnx.rewrite.fused_graph import prepare_decoder
    from anyformer_onnx.session.providers import CUDA
    from anyformer_onnx.text.setup import TextSetup
    from anyformer_onnx.text.text_graph import open_text_graph

    assert isinstance(graphs, GraphChoice)  # this family chooses one graph

    def fused(path: Path, text: TextSetup, label: str) -> tuple[Path, str]:
        config = text.config or model.config
        prepared = prepare_decoder(
            path,
            config,
            repo=model.repo if model.source == "hub" else None,
            context=context_for(config, request.context),
            progress=progress,
            label=label,
            file=graphs.graph.name,
        )
        return prepared.path, prepared.note

    rewrite = fused if provider != CUDA and fuse_option(request) else None
    opened = open_text_graph(model, request, progress, graphs, provider, rewrite=rewrite)
    config = opened.text.config or model.config
    graph = DecoderGraph(opened.session, config, opened.label)
    context = context_for(config, request.context)
    opened.details["context"] = context
    device = "cuda" if opened.provider == CUDA else "cpu"
    return OnnxChatModel(graph, opened.text, device=device, context=context, details=opened.details)


FAMILY = TaskFamily(
    name="chat",
    tasks=CHAT_TASKS,
    choose=_choose,
    graph_paths=known_paths(DECODER_STEMS),
    open=open_chat,
    problem=_problem,
    decoder=True,
    guess=_guess,
    architectures=(("ForCausalLM", TEXT_GENERATION), ("LMHeadModel", TEXT_GENERATION)),
)
