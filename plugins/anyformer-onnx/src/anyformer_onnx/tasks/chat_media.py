"""What a chat task asks of a repo's media encoders and processor files: the checks both chat families share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from anyformer.plugin import Model, Refusal
from anyformer_onnx.chat.per_layer import declares_per_layer_inputs, per_layer_encoders, unread_media
from anyformer_onnx.media.processor_files import PREPROCESSOR_CONFIG, PROCESSOR_CONFIG
from anyformer_onnx.tasks.names import AUDIO_TEXT_TO_TEXT, IMAGE_TEXT_TO_TEXT, TEXT_GENERATION

#: Tasks that chat through ``generate``: a text-only decoder, or one graph per module with a vision or audio encoder.
CHAT_TASKS = (TEXT_GENERATION, IMAGE_TEXT_TO_TEXT, AUDIO_TEXT_TO_TEXT)
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
