"""``load``: choose the graph, fetch it with its external data and text files, open the right handle.

Imported by the ``load`` hook only: it imports onnxruntime (through :mod:`ort_session`).
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
from anyformer_onnx.audio_encoder import AudioGraph, feature_extractor_config
from anyformer_onnx.chat_model import OnnxChatModel
from anyformer_onnx.classifier_model import OnnxClassifierModel
from anyformer_onnx.decoder import DecoderGraph
from anyformer_onnx.embedding_model import OnnxEmbeddingModel, pooling_of
from anyformer_onnx.encoder import EncoderGraph
from anyformer_onnx.estimate import context_for
from anyformer_onnx.fused_graph import prepare_decoder
from anyformer_onnx.gemma4_audio import gemma4_audio_kind
from anyformer_onnx.gemma4_image import gemma4_image_kind
from anyformer_onnx.gemma4_media import gemma4_media_pad
from anyformer_onnx.graphs import (
    SPEECH_STEMS,
    GraphChoice,
    GraphSet,
    choose_graph,
    choose_graph_set,
    media_chat_stems,
    module_graphs,
)
from anyformer_onnx.image_preprocessing import ImagePreprocessor
from anyformer_onnx.log_mel import LogMel
from anyformer_onnx.multimodal import (
    MediaKind,
    MediaPrompter,
    audio_kind,
    audio_token_id,
    image_kind,
    image_token_id,
    qwen_image_kind,
)
from anyformer_onnx.ort_session import open_session
from anyformer_onnx.per_layer import PER_LAYER_INPUTS, declares_per_layer_inputs, unread_media
from anyformer_onnx.plugin import PREPROCESSOR_CONFIG, PROCESSOR_CONFIG, SPEECH_FILES, stems_for
from anyformer_onnx.qwen_vl_image import GRID_INPUTS, QwenVisionGraph, QwenVLImageProcessor
from anyformer_onnx.runtime import CUDA, available_providers, choose_provider
from anyformer_onnx.speech_model import OnnxSpeechRecognizerModel, WhisperGraphs
from anyformer_onnx.tasks import (
    CHAT_TASKS,
    CLASSIFICATION_TASKS,
    DEPTH_ESTIMATION,
    EMBEDDING_TASKS,
    IMAGE_CLASSIFICATION,
    IMAGE_SEGMENTATION,
    IMAGE_TASKS,
    SPEECH_RECOGNITION,
    TASKS,
    task_of,
)
from anyformer_onnx.text_setup import TEXT_FILES, load_text_setup, load_tokenizer, present_text_files
from anyformer_onnx.vision_models import (
    OnnxDepthEstimatorModel,
    OnnxImageClassifierModel,
    OnnxMaskSegmenterModel,
    OnnxObjectDetectorModel,
    OnnxSegmenterModel,
    VisionGraph,
)

POOLING_CONFIG = "1_Pooling/config.json"
#: ``Qwen2AudioProcessor``'s ``audio_bos_token`` and ``audio_eos_token`` defaults.
QWEN2_AUDIO_WRAPPERS = ("<|audio_bos|>", "<|audio_eos|>")


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


def _fuse_option(request: Request) -> bool:
    """The ``fuse_attention`` option (default True): rewrite a decoder's attention for the CPU."""
    value = request.options.get("fuse_attention", True)
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    if not isinstance(value, bool):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"the fuse_attention option must be true or false, got {value!r}")
    return value


def _option(request: Request, key: str) -> str | None:
    value = request.options.get(key)
    if value is not None and not isinstance(value, str):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"the {key} option must be a string, got {value!r}")
    return value


def open_model(model: Model, request: Request, progress: ProgressCallback) -> BackendModel:
    """Fetch, validate and open ``model`` for its task: a chat handle or an embedding handle."""
    task = task_of(model, request.task)
    if task not in TASKS:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"task {task}; the onnx backend runs {', '.join(TASKS)}")
    wanted_provider = {"cuda": CUDA, "cpu": "CPUExecutionProvider", None: None}.get(_option(request, "provider"))
    provider = choose_provider(available_providers(), wanted_provider)
    device = "cuda" if provider == CUDA else "cpu"
    if task == SPEECH_RECOGNITION:
        graphs = choose_graph_set(model, SPEECH_STEMS, device, _option(request, "precision"))
        if graphs is None:
            raise AnyformerError(
                ErrorCode.NO_BACKEND, f"{model.ref}: no {', '.join(SPEECH_STEMS)} graphs at known paths"
            )
        return _open_speech_model(model, request, progress, graphs, provider)
    if task in CHAT_TASKS and module_graphs(model):
        stems = media_chat_stems(model)
        modules = choose_graph_set(model, stems, device, _option(request, "precision"))
        text_only = declares_per_layer_inputs(model.config)  # embed_tokens and the decoder alone
        if modules is None or len(stems) < (2 if text_only else 3):
            wanted = ", ".join(stems) if len(stems) > 2 else "embed_tokens, decoder_model_merged and an encoder"
            raise AnyformerError(ErrorCode.NO_BACKEND, f"{model.ref}: no {wanted} graphs of one precision")
        return _open_media_chat(model, request, progress, modules, provider, task)
    choice = choose_graph(model, stems_for(task), device, _option(request, "precision"))
    if choice is None:
        raise AnyformerError(ErrorCode.NO_BACKEND, f"{model.ref}: no {task} graph at a known path")
    if task in IMAGE_TASKS:
        return _open_vision_model(model, request, progress, task, choice, provider)
    extra = present_text_files(model)
    if task in EMBEDDING_TASKS and model.file(POOLING_CONFIG) is not None:
        extra.append(POOLING_CONFIG)
    paths = fetch_files(model, [*choice.files, *extra], progress, backend=BACKEND_ID)
    graph_path = paths[choice.graph.name]
    missing = [name for name in TEXT_FILES if name not in paths]
    if missing and model.file(choice.graph.name) is not None and model.source == "local":
        paths.update(_beside(graph_path, missing))
    progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=choice.graph.name, total=choice.size))
    label = f"{model.ref} ({choice.graph.name})"
    text = load_text_setup(paths, label)
    details: dict[str, Any] = {"file": choice.graph.name, "precision": choice.precision}
    if task in CHAT_TASKS and device == "cpu" and _fuse_option(request):
        config = text.config or model.config
        prepared = prepare_decoder(
            graph_path,
            config,
            repo=model.repo if model.source == "hub" else None,
            context=context_for(config, request.context),
            progress=progress,
            label=label,
            file=choice.graph.name,
        )
        graph_path = prepared.path
        details["graph"] = prepared.note
    session, actual = open_session(graph_path, provider=provider, threads=request.options.get("threads"))
    progress(
        ProgressEvent(stage="load", backend=BACKEND_ID, file=choice.graph.name, done=choice.size, total=choice.size)
    )
    details["provider"] = actual
    if task in CHAT_TASKS:
        config = text.config or model.config
        graph = DecoderGraph(session, config, label)
        context = context_for(config, request.context)
        details["context"] = context
        return OnnxChatModel(graph, text, device="cuda" if actual == CUDA else "cpu", context=context, details=details)
    encoder = EncoderGraph(session, text.tokenizer, label)
    if task in CLASSIFICATION_TASKS:
        return OnnxClassifierModel(encoder, task=task, config=text.config or model.config, details=details)
    pooling_path = paths.get(POOLING_CONFIG)
    pooling = pooling_of(read_config_json(pooling_path, f"{POOLING_CONFIG} of {model.ref}")) if pooling_path else "mean"
    return OnnxEmbeddingModel(encoder, task=task, pooling=pooling, details=details)


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


def _open_media_chat(
    model: Model, request: Request, progress: ProgressCallback, graphs: GraphSet, provider: str, task: str
) -> BackendModel:
    """Open a multimodal chat export: embed_tokens, a decoder reading embeddings, a vision and/or audio encoder."""
    stems = media_chat_stems(model)
    extra = [*present_text_files(model), *(n for n in (PREPROCESSOR_CONFIG, PROCESSOR_CONFIG) if model.file(n))]
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


def _open_vision_model(
    model: Model, request: Request, progress: ProgressCallback, task: str, choice: GraphChoice, provider: str
) -> BackendModel:
    """Open an image graph with its preprocessing (preprocessor_config.json) and labels (config.json)."""
    if model.file(PREPROCESSOR_CONFIG) is None:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{model.ref}: {task} needs {PREPROCESSOR_CONFIG}")
    extra = [name for name in ("config.json", PREPROCESSOR_CONFIG) if model.file(name) is not None]
    paths = fetch_files(model, [*choice.files, *extra], progress, backend=BACKEND_ID)
    label = f"{model.ref} ({choice.graph.name})"
    preprocessor = ImagePreprocessor.from_config(
        read_config_json(paths[PREPROCESSOR_CONFIG], f"{PREPROCESSOR_CONFIG} of {label}"), label
    )
    config = read_config_json(paths["config.json"], f"config.json of {label}") if "config.json" in paths else {}
    progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=choice.graph.name, total=choice.size))
    session, actual = open_session(paths[choice.graph.name], provider=provider, threads=request.options.get("threads"))
    progress(
        ProgressEvent(stage="load", backend=BACKEND_ID, file=choice.graph.name, done=choice.size, total=choice.size)
    )
    details: dict[str, Any] = {"file": choice.graph.name, "precision": choice.precision, "provider": actual}
    graph = VisionGraph(session, preprocessor, label)
    config = config or dict(model.config)
    if task == IMAGE_CLASSIFICATION:
        return OnnxImageClassifierModel(graph, config=config, details=details)
    if task == IMAGE_SEGMENTATION:
        if "class_queries_logits" in graph.outputs:
            return OnnxMaskSegmenterModel(graph, config=config, details=details)
        return OnnxSegmenterModel(graph, config=config, details=details)
    if task == DEPTH_ESTIMATION:
        return OnnxDepthEstimatorModel(graph, details=details)
    return OnnxObjectDetectorModel(graph, config=config, details=details)


def _open_speech_model(
    model: Model, request: Request, progress: ProgressCallback, graphs: GraphSet, provider: str
) -> BackendModel:
    """Open a Whisper-style split export with its log-mel settings, tokenizer and generation config."""
    missing = [name for name in SPEECH_FILES if model.file(name) is None]
    if missing:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{model.ref}: speech recognition needs {missing[0]}")
    extra = [name for name in (*SPEECH_FILES, "config.json") if model.file(name) is not None]
    paths = fetch_files(model, [*graphs.files, *extra], progress, backend=BACKEND_ID)
    label = f"{model.ref} ({graphs.graph.name})"
    front_end = LogMel.from_config(
        read_config_json(paths[PREPROCESSOR_CONFIG], f"{PREPROCESSOR_CONFIG} of {label}"), label
    )
    generation = read_config_json(paths["generation_config.json"], f"generation_config.json of {label}")
    tokenizer = load_tokenizer(paths["tokenizer.json"], label)
    progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=graphs.graph.name, total=graphs.size))
    threads = request.options.get("threads")
    sessions = []
    actual = provider
    for part in graphs.parts:
        session, actual = open_session(paths[part.graph.name], provider=provider, threads=threads)
        sessions.append(session)
    progress(
        ProgressEvent(stage="load", backend=BACKEND_ID, file=graphs.graph.name, done=graphs.size, total=graphs.size)
    )
    details: dict[str, Any] = {"files": list(graphs.files), "precision": graphs.precision, "provider": actual}
    encoder, first, with_past = sessions
    return OnnxSpeechRecognizerModel(
        WhisperGraphs(encoder, first, with_past, label),
        front_end=front_end,
        tokenizer=tokenizer,
        generation=generation,
        details=details,
    )
