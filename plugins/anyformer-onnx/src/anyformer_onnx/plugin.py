"""The anyformer hooks of the ONNX backend. Nothing heavy is imported here: onnxruntime loads in ``load``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from anyformer.plugin import (
    BackendModel,
    Caps,
    Estimate,
    Model,
    ProgressCallback,
    Rank,
    Refusal,
    Request,
    StoreEntry,
    Verdict,
    format_size,
    hookimpl,
)
from anyformer_onnx import BACKEND_ID
from anyformer_onnx.estimate import context_for, kv_cache_bytes, memory_need
from anyformer_onnx.graphs import (
    DECODER_STEMS,
    ENCODER_STEMS,
    SPEECH_STEMS,
    GraphChoice,
    GraphSet,
    choose_graph,
    choose_graph_set,
    media_chat_stems,
    media_encoders,
    module_graphs,
)
from anyformer_onnx.per_layer import declares_per_layer_inputs, per_layer_encoders, unread_media
from anyformer_onnx.runtime import CUDA, INSTALL_HINT, expected_provider, onnxruntime_installed
from anyformer_onnx.tasks import (
    AUDIO_TEXT_TO_TEXT,
    CHAT_TASKS,
    DETR_STYLE,
    IMAGE_SEGMENTATION,
    IMAGE_TASKS,
    IMAGE_TEXT_TO_TEXT,
    MASK_SEGMENTATION_HEADS,
    OBJECT_DETECTION,
    SPEECH_RECOGNITION,
    TASKS,
    WHISPER_STYLE,
    task_of,
)

#: The file every vision task reads its resize, crop and normalisation from.
PREPROCESSOR_CONFIG = "preprocessor_config.json"
#: A processor's settings as transformers 5 saves them: its feature extractor nested inside.
PROCESSOR_CONFIG = "processor_config.json"

#: What speech recognition reads beside its graphs: the log-mel settings, the tokenizer, the prompt tokens.
SPEECH_FILES = (PREPROCESSOR_CONFIG, "tokenizer.json", "generation_config.json")

#: Tags of models another engine runs: text diffusion decodes by unmasking, not left to right.
FOREIGN_TAGS = ("text-diffusion",)


def stems_for(task: str) -> tuple[str, ...]:
    """The graph names a task reads: a decoder for chat, three parts for speech, an encoder otherwise."""
    if task == SPEECH_RECOGNITION:
        return SPEECH_STEMS
    return DECODER_STEMS if task in CHAT_TASKS else ENCODER_STEMS


def task_problem(model: Model, task: str) -> tuple[Refusal, str] | None:
    """Why this model's files or config do not fit ``task`` (None when they do), read from the description."""
    if task in IMAGE_TASKS and model.file(PREPROCESSOR_CONFIG) is None:
        return Refusal.FORMAT, f"{task} needs {PREPROCESSOR_CONFIG} (the resize and normalisation), absent here"
    if task == SPEECH_RECOGNITION:
        kind = model.config.get("model_type")
        if kind not in WHISPER_STYLE:
            return Refusal.MODEL, f"speech model {kind!r}: this backend reads Whisper-style encoder-decoders"
        missing = [name for name in SPEECH_FILES if model.file(name) is None]
        if missing:
            return Refusal.FORMAT, f"automatic-speech-recognition needs {missing[0]}, absent here"
    if task == IMAGE_SEGMENTATION:
        architectures = model.config.get("architectures")
        names = [a for a in architectures if isinstance(a, str)] if isinstance(architectures, list) else []
        if not any(name.endswith("ForSemanticSegmentation") or name in MASK_SEGMENTATION_HEADS for name in names):
            head = f"head {names[0]!r}" if names else "a model without config.json architectures"
            return (
                Refusal.MODEL,
                f"image-segmentation of {head}: this backend reads semantic heads (…ForSemanticSegmentation) "
                f"and {', '.join(MASK_SEGMENTATION_HEADS)} only",
            )
    if task == OBJECT_DETECTION:
        kind = model.config.get("model_type")
        if kind not in DETR_STYLE:
            return Refusal.MODEL, f"object-detection head {kind!r}: this backend reads {', '.join(DETR_STYLE)} heads"
    return None


#: What a multimodal chat model reads beside text, by encoder graph.
MEDIA_INPUTS = {"vision_encoder": "image", "audio_encoder": "audio"}


def uses_mrope(config: Mapping[str, Any]) -> bool:
    """True when config.json gives the decoder M-RoPE (an ``mrope_section``: Qwen2-VL, Qwen2.5-VL, Qwen2.5-Omni…)."""
    found: list[Any] = [config]
    for key in ("thinker_config", "text_config"):
        found += [nested.get(key) for nested in list(found) if isinstance(nested, Mapping)]
    for part in found:
        if not isinstance(part, Mapping):
            continue
        for key in ("rope_scaling", "rope_parameters"):
            rope = part.get(key)
            if isinstance(rope, Mapping) and "mrope_section" in rope:
                return True
    return False


def media_problem(model: Model, task: str, encoders: tuple[str, ...]) -> tuple[Refusal, str] | None:
    """Why a chat task does not fit the repo's media encoders and their processor files (None when it does)."""
    wanted = {IMAGE_TEXT_TO_TEXT: "vision_encoder", AUDIO_TEXT_TO_TEXT: "audio_encoder"}.get(task)
    if wanted and declares_per_layer_inputs(model.config) and wanted not in per_layer_encoders(model.config):
        return Refusal.MODEL, f"{task} on this model is not implemented: {unread_media(model.config)}"
    if task == IMAGE_TEXT_TO_TEXT and "vision_encoder" not in encoders:
        return Refusal.MODEL, "image-text-to-text needs a vision_encoder graph beside embed_tokens and a decoder"
    if task == AUDIO_TEXT_TO_TEXT and "audio_encoder" not in encoders:
        return Refusal.MODEL, "audio-text-to-text needs an audio_encoder graph beside embed_tokens and a decoder"
    if "audio_encoder" in encoders and uses_mrope(model.config):
        return Refusal.MODEL, "audio with an M-RoPE decoder (Qwen2.5-Omni-style positions) is not implemented"
    # Gemma 4's image processor may sit in processor_config.json alone (transformers 5's layout).
    gemma4 = model.config.get("model_type") == "gemma4" and model.file(PROCESSOR_CONFIG) is not None
    if "vision_encoder" in encoders and model.file(PREPROCESSOR_CONFIG) is None and not gemma4:
        return Refusal.FORMAT, f"image chat needs {PREPROCESSOR_CONFIG}, absent here"
    if "audio_encoder" in encoders and model.file(PREPROCESSOR_CONFIG) is None and model.file(PROCESSOR_CONFIG) is None:
        return Refusal.FORMAT, f"audio chat needs the feature extractor's {PREPROCESSOR_CONFIG} (or {PROCESSOR_CONFIG})"
    return None


def choose_graphs(model: Model, task: str, device: str, wanted: str | None) -> GraphChoice | GraphSet | None:
    """The graph (or, for speech, the set of graphs) a load of ``task`` reads; None when none is at a known path."""
    if task == SPEECH_RECOGNITION:
        return choose_graph_set(model, SPEECH_STEMS, device, wanted)
    if task in CHAT_TASKS and module_graphs(model):
        return choose_graph_set(model, media_chat_stems(model), device, wanted)
    return choose_graph(model, stems_for(task), device, wanted)


def plan(model: Model, caps: Caps, request: Request) -> tuple[str, GraphChoice | GraphSet | None, str]:
    """The task, the graphs a load reads (None: no graph at a known path) and the expected provider."""
    task = task_of(model, request.task)
    provider = expected_provider(caps.gpu)
    device = "cuda" if provider == CUDA else "cpu"
    wanted = request.options.get("precision")
    choice = choose_graphs(model, task, device, wanted if isinstance(wanted, str) else None)
    return task, choice, provider


@hookimpl
def can_run(model: Model, caps: Caps, request: Request) -> Verdict:
    """Refuse with ``format``/``model``/``task``/``budget``/``memory``/``runtime``, or estimate the load."""
    if "onnx" not in model.formats:
        return Verdict.refuse(BACKEND_ID, Refusal.FORMAT, "no .onnx file in the repo")
    foreign = [tag for tag in FOREIGN_TAGS if tag in model.tags]
    if foreign:
        return Verdict.refuse(
            BACKEND_ID, Refusal.MODEL, f"tagged {foreign[0]}: it decodes by unmasking, not with a KV cache"
        )
    task, choice, provider = plan(model, caps, request)
    if task not in TASKS:
        return Verdict.refuse(BACKEND_ID, Refusal.TASK, f"task {task}; this backend runs {', '.join(TASKS)}")
    modules = module_graphs(model)
    if modules and task not in CHAT_TASKS:
        return Verdict.refuse(BACKEND_ID, Refusal.MODEL, f"one graph per module ({modules[0]}…): read for chat only")
    encoders = media_encoders(model)
    # A decoder with per-layer inputs is read for text alone: embed_tokens and the decoder suffice.
    if modules and (choice is None or not (encoders or declares_per_layer_inputs(model.config))):
        return Verdict.refuse(
            BACKEND_ID,
            Refusal.MODEL,
            f"one graph per module ({', '.join(modules)}): this backend reads embed_tokens, decoder_model_merged "
            "and a vision_encoder, an audio_encoder or both, all of one precision (a speech_encoder is not read)",
        )
    problem = media_problem(model, task, encoders) or task_problem(model, task)
    if problem is not None:
        return Verdict.refuse(BACKEND_ID, *problem)
    if choice is None:
        where = ", ".join(f"[onnx/]{stem}[_q4|_fp16|…].onnx" for stem in stems_for(task))
        if task == SPEECH_RECOGNITION:
            where = f"all of {where}, of one precision"
        wanted = request.options.get("precision")
        which = f"{wanted} " if isinstance(wanted, str) else ""
        return Verdict.refuse(BACKEND_ID, Refusal.FORMAT, f"no {which}{task} graph at a known path ({where})")
    on_gpu = provider == CUDA
    chat = task in CHAT_TASKS
    text_config = model.config.get("text_config")
    # A multimodal config nests its decoder's shapes under text_config.
    config = text_config if isinstance(text_config, dict) else model.config
    context = context_for(config, request.context) if chat else 0
    kv = kv_cache_bytes(config, context, 2 if on_gpu else 4) if chat else 0
    need = memory_need(choice.size, kv)
    details = {
        "file": choice.graph.name,
        "precision": choice.precision,
        "external_data": len(choice.data),
        "provider": provider,
        "task": task,
    }
    if chat:
        details["context"] = context
        details["inputs"] = ["text", *(MEDIA_INPUTS[stem] for stem in encoders)]
    if on_gpu:
        budget = request.budget_or(caps.gpu_bytes)
        if need > budget:
            return Verdict.refuse(
                BACKEND_ID,
                Refusal.BUDGET,
                f"{choice.graph.name}: needs {format_size(need)} of GPU memory (graph and external data "
                f"{format_size(choice.size)}, KV cache {format_size(kv)}); budget {format_size(budget)}",
                need=need,
            )
    # On the GPU the host still holds the weights while the session copies them over.
    host = memory_need(choice.size, 0) if on_gpu else need
    if host > caps.ram_bytes:
        return Verdict.refuse(
            BACKEND_ID,
            Refusal.MEMORY,
            f"{choice.graph.name}: needs {format_size(host)} of host memory (graph and external data "
            f"{format_size(choice.size)}, KV cache {format_size(kv)}); {format_size(caps.ram_bytes)} available",
            need=host,
        )
    if not onnxruntime_installed():
        return Verdict.refuse(BACKEND_ID, Refusal.RUNTIME, f"onnxruntime is not installed: {INSTALL_HINT}")
    return Verdict.accept(
        BACKEND_ID,
        Estimate(
            gpu_bytes=need if on_gpu else 0,
            ram_bytes=host,
            disk_bytes=choice.size,
            rank=Rank.GENERAL,
            details=details,
            files=choice.files,
        ),
    )


@hookimpl
def load(model: Model, request: Request, progress: ProgressCallback) -> BackendModel:
    """Fetch and validate the chosen graph, then open it with onnxruntime."""
    from anyformer_onnx.loading import open_model  # imports onnxruntime

    return open_model(model, request, progress)


@hookimpl
def store_list() -> list[StoreEntry]:
    """The decoder graphs this backend fused on a first load, kept under ``ANYFORMER_HOME/onnx``."""
    from anyformer_onnx.fused_store import fused_entries

    return fused_entries()
