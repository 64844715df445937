"""Chat on an export with one graph per module: embed_tokens, a decoder reading embeddings, media encoders.

Gemma 3n / 4, LLaVA-style, Qwen2-VL-family and Qwen2-Audio exports: text with the images and audio
whose encoders the repo has (a decoder with per-layer inputs also chats in text alone).
"""

from __future__ import annotations

from anyformer.plugin import BackendModel, Model, ProgressCallback, Refusal, Request
from anyformer_onnx.chat.per_layer import declares_per_layer_inputs
from anyformer_onnx.graphs import GraphSet, choose_graph_set, media_chat_stems, media_encoders, module_graphs
from anyformer_onnx.media.processor_files import PREPROCESSOR_CONFIG, PROCESSOR_CONFIG
from anyformer_onnx.tasks.chat_media import CHAT_TASKS, media_problem
from anyformer_onnx.tasks.family import Graphs, Problem, TaskFamily
from anyformer_onnx.tasks.names import AUDIO_TEXT_TO_TEXT, IMAGE_TEXT_TO_TEXT, TEXT_GENERATION


def _choose(model: Model, device: str, wanted: str | None) -> GraphSet | None:
    """embed_tokens, the decoder and every media encoder, of one precision; None without an encoder it reads.

    A decoder with per-layer inputs is read for text alone: embed_tokens and the decoder suffice.
    """
    stems = media_chat_stems(model)
    if len(stems) < (2 if declares_per_layer_inputs(model.config) else 3):
        return None
    return choose_graph_set(model, stems, device, wanted)


def _problem(model: Model, task: str, graphs: Graphs | None) -> Problem:
    if graphs is None:
        return (
            Refusal.MODEL,
            f"one graph per module ({', '.join(module_graphs(model))}): this backend reads embed_tokens, "
            "decoder_model_merged and a vision_encoder, an audio_encoder or both, all of one precision "
            "(a speech_encoder is not read)",
        )
    return media_problem(model, task, media_encoders(model))


def _decides(model: Model) -> str | None:
    """Gemma 3n / Gemma 4 small, one graph per module: text chat, with the media whose encoders are read."""
    if not (declares_per_layer_inputs(model.config) and module_graphs(model)):
        return None
    read = media_encoders(model)
    if "vision_encoder" in read:
        return IMAGE_TEXT_TO_TEXT
    return AUDIO_TEXT_TO_TEXT if read else TEXT_GENERATION


def _guess(model: Model) -> str | None:
    stems = [f.name.rsplit("/", 1)[-1] for f in model.files]
    if any(stem.startswith("vision_encoder") for stem in stems):
        return IMAGE_TEXT_TO_TEXT  # one graph per module with a vision encoder: chat with images (and audio)
    if any(stem.startswith("audio_encoder") for stem in stems):
        return AUDIO_TEXT_TO_TEXT  # one graph per module with an audio encoder only: chat with audio
    return None


def _open(
    model: Model, request: Request, progress: ProgressCallback, task: str, graphs: Graphs, provider: str
) -> BackendModel:
    from anyformer_onnx.media.chat_loading import open_media_chat  # numpy and the encoders: at load only

    assert isinstance(graphs, GraphSet)  # this family chooses a set of graphs
    return open_media_chat(model, request, progress, graphs, provider, task, FAMILY.files)


FAMILY = TaskFamily(
    name="media_chat",
    tasks=CHAT_TASKS,
    choose=_choose,
    graph_paths="embed_tokens, decoder_model_merged and a vision_encoder or an audio_encoder, of one precision",
    open=_open,
    files=(PREPROCESSOR_CONFIG, PROCESSOR_CONFIG),
    problem=_problem,
    modules=True,
    decoder=True,
    decides=_decides,
    guess=_guess,
    architectures=(
        ("AudioForConditionalGeneration", AUDIO_TEXT_TO_TEXT),  # Qwen2-Audio
        ("ForConditionalGeneration", IMAGE_TEXT_TO_TEXT),
    ),
)
