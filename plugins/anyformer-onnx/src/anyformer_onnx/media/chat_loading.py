"""Opening a multimodal chat export: embed_tokens, a decoder reading embeddings, a vision and/or audio encoder.

The loader of :mod:`anyformer_onnx.tasks.media_chat`, imported when such a model loads (it imports numpy).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from anyformer.plugin import (
    AnyformerError,
    BackendModel,
    ErrorCode,
    Model,
    ProgressCallback,
    ProgressEvent,
    Request,
    fetch_files,
    read_config_json,
)
from anyformer_onnx import BACKEND_ID
from anyformer_onnx.chat.decoder import DecoderGraph
from anyformer_onnx.chat.handle import OnnxChatModel
from anyformer_onnx.chat.per_layer import PER_LAYER_INPUTS, declares_per_layer_inputs, unread_media
from anyformer_onnx.estimate import context_for
from anyformer_onnx.graphs import GraphSet, media_chat_stems
from anyformer_onnx.media.audio_encoder import AudioGraph, feature_extractor_config
from anyformer_onnx.media.gemma4_audio import gemma4_audio_kind
from anyformer_onnx.media.gemma4_image import gemma4_image_kind
from anyformer_onnx.media.gemma4_media import gemma4_media_pad
from anyformer_onnx.media.image_preprocessing import ImagePreprocessor
from anyformer_onnx.media.log_mel import LogMel
from anyformer_onnx.media.processor_files import PREPROCESSOR_CONFIG, PROCESSOR_CONFIG
from anyformer_onnx.media.prompter import (
    MediaKind,
    MediaPrompter,
    audio_kind,
    audio_token_id,
    image_kind,
    image_token_id,
    qwen_image_kind,
)
from anyformer_onnx.media.qwen_vl_image import GRID_INPUTS, QwenVisionGraph, QwenVLImageProcessor
from anyformer_onnx.session.ort_session import open_session
from anyformer_onnx.session.providers import CUDA
from anyformer_onnx.text.setup import load_text_setup, present_text_files
from anyformer_onnx.vision.handles import VisionGraph

#: ``Qwen2AudioProcessor``'s ``audio_bos_token`` and ``audio_eos_token`` defaults.
QWEN2_AUDIO_WRAPPERS = ("<|audio_bos|>", "<|audio_eos|>")


def _processor_configs(paths: dict[str, Path], label: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """preprocessor_config.json and processor_config.json, each None when the repo has none."""
    found = []
    for name in (PREPROCESSOR_CONFIG, PROCESSOR_CONFIG):
        found.append(read_config_json(paths[name], f"{name} of {label}") if name in paths else None)
    return found[0], found[1]


def _audio_wrappers(config: Mapping[str, Any], processor: dict[str, Any] | None) -> tuple[str, str]:
    """The processor's ``audio_bos_token`` and ``audio_eos_token`` ("" where it has none).

    processor_config.json names them (transformers 5 saves a processor's attributes there); a
    Qwen2-Audio repo without one gets ``Qwen2AudioProcessor``'s defaults, as transformers does.
    """
    defaults = QWEN2_AUDIO_WRAPPERS if config.get("model_type") == "qwen2_audio" else ("", "")
    found = []
    for key, default in zip(("audio_bos_token", "audio_eos_token"), defaults, strict=True):
        value = processor.get(key) if processor else None
        found.append(value if isinstance(value, str) else default)
    return found[0], found[1]


def open_media_chat(
    model: Model,
    request: Request,
    progress: ProgressCallback,
    graphs: GraphSet,
    provider: str,
    task: str,
    files: tuple[str, ...],
) -> BackendModel:
    """Open a multimodal chat export: embed_tokens, a decoder reading embeddings, a vision and/or audio encoder."""
    stems = media_chat_stems(model)
    extra = [*present_text_files(model), *(n for n in files if model.file(n))]
    paths = fetch_files(model, [*graphs.files, *extra], progress, backend=BACKEND_ID)
    label = f"{model.ref} ({graphs.graph.name})"
    text = load_text_setup(paths, label)
    config = text.config or dict(model.config)
    preprocessor, processor = _processor_configs(paths, label)
    progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=graphs.graph.name, total=graphs.size))
    threads = request.options.get("threads")
    sessions = {}
    actual = provider
    for stem, part in zip(stems, graphs.parts, strict=True):
        sessions[stem], actual = open_session(paths[part.graph.name], provider=provider, threads=threads)
    done = ProgressEvent(stage="load", backend=BACKEND_ID, file=graphs.graph.name, done=graphs.size, total=graphs.size)
    progress(done)
    text_config = config.get("text_config")
    decoder_config = text_config if isinstance(text_config, dict) else config
    graph = DecoderGraph(sessions["decoder_model_merged"], decoder_config, label)
    kinds: list[MediaKind] = []
    encoders: list[Any] = []
    mrope_merge = None
    gemma4 = config.get("model_type") == "gemma4"
    # Gemma 4's image and audio encoders open alike, from the session, the tokenizer and the three configs.
    for stem, open_kind in (("vision_encoder", gemma4_image_kind), ("audio_encoder", gemma4_audio_kind)):
        if gemma4 and stem in sessions:
            encoder, kind = open_kind(sessions[stem], text, config, preprocessor, processor, label)
            encoders.append(encoder)
            kinds.append(kind)
    if "vision_encoder" in sessions and not gemma4:
        token = image_token_id(config)
        if token is None or preprocessor is None:
            missing = "config.json's image_token_index" if token is None else PREPROCESSOR_CONFIG
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: image chat needs {missing}")
        vision_inputs = {i.name for i in sessions["vision_encoder"].get_inputs()}
        if graph.mrope or vision_inputs & set(GRID_INPUTS):
            qwen = _qwen_vision(sessions["vision_encoder"], graph, config, preprocessor, label)
            mrope_merge = qwen.processor.merge
            encoders.append(qwen)
            kinds.append(qwen_image_kind(qwen, text, token, _vision_wrappers(config, label), label))
        else:
            vision = VisionGraph(sessions["vision_encoder"], ImagePreprocessor.from_config(preprocessor, label), label)
            encoders.append(vision)
            kinds.append(image_kind(vision, text, token, label))
    if "audio_encoder" in sessions and not gemma4:
        if graph.mrope:
            raise AnyformerError(
                ErrorCode.BAD_MODEL,
                f"{label}: audio with an M-RoPE decoder (position_ids [3, batch, seq], Qwen2.5-Omni-style) "
                "is not implemented",
            )
        token = audio_token_id(config)
        settings = feature_extractor_config(preprocessor, processor)
        if token is None or settings is None:
            missing = "config.json's audio_token_index" if token is None else "a feature extractor config"
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: audio chat needs {missing}")
        audio = AudioGraph(sessions["audio_encoder"], LogMel.from_config(settings, label), label)
        encoders.append(audio)
        kinds.append(audio_kind(audio, text, token, _audio_wrappers(config, processor), label))
    unread = unread_media(config) if declares_per_layer_inputs(config) else None
    media_pad = gemma4_media_pad(config) if gemma4 else None
    media = MediaPrompter(sessions["embed_tokens"], text, kinds, encoders, label, mrope_merge, unread, media_pad)
    if graph.per_layer and not media.per_layer:
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"{label}: the decoder reads {PER_LAYER_INPUTS} and embed_tokens does not return them"
        )
    context = context_for(decoder_config, request.context)
    details: dict[str, Any] = {
        "files": list(graphs.files),
        "precision": graphs.precision,
        "provider": actual,
        "context": context,
    }
    device = "cuda" if actual == CUDA else "cpu"
    return OnnxChatModel(graph, text, device=device, context=context, details=details, media=media, task=task)


def _qwen_vision(
    session: Any,
    graph: DecoderGraph,
    config: Mapping[str, Any],
    preprocessor: Mapping[str, Any],
    label: str,
) -> QwenVisionGraph:
    """The Qwen2-VL-family vision encoder beside an M-RoPE decoder.

    ``BAD_MODEL`` for the halves that do not fit: a vision encoder taking a patch grid beside a
    decoder without M-RoPE positions, or the other way round (LLaVA-style pixels for a decoder
    that places images on their grids), and a merge size config.json and the processor disagree on.
    """
    inputs = {i.name for i in session.get_inputs()}
    if not graph.mrope:
        raise AnyformerError(
            ErrorCode.BAD_MODEL,
            f"{label}: the vision encoder takes an image grid but the decoder's position_ids are not "
            "M-RoPE's [3, batch, seq]",
        )
    if not inputs & set(GRID_INPUTS):
        raise AnyformerError(
            ErrorCode.BAD_MODEL,
            f"{label}: an M-RoPE decoder (position_ids [3, batch, seq]) with a vision encoder that takes no "
            f"image grid ({' or '.join(GRID_INPUTS)}): this backend places images by their grid only",
        )
    processor = QwenVLImageProcessor.from_config(preprocessor, label)
    vision_config = config.get("vision_config")
    merge = vision_config.get("spatial_merge_size", 2) if isinstance(vision_config, Mapping) else 2
    if merge != processor.merge:
        raise AnyformerError(
            ErrorCode.BAD_MODEL,
            f"{label}: config.json's spatial_merge_size {merge!r} is not the processor's merge_size {processor.merge}",
        )
    return QwenVisionGraph(session, processor, label)


def _vision_wrappers(config: Mapping[str, Any], label: str) -> tuple[int, int]:
    """config.json's ``vision_start_token_id`` and ``vision_end_token_id``; ``BAD_MODEL`` without them."""
    found: list[int] = []
    for key in ("vision_start_token_id", "vision_end_token_id"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: Qwen2-VL image chat needs config.json's {key}")
        found.append(value)
    return found[0], found[1]
