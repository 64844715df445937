"""The tasks this backend runs, and the task a model is for when the request names none."""

from __future__ import annotations

from anyformer.plugin import Model
from anyformer_onnx.graphs import media_encoders, module_graphs
from anyformer_onnx.chat.per_layer import declares_per_layer_inputs

TEXT_GENERATION = "text-generation"
FEATURE_EXTRACTION = "feature-extraction"
SENTENCE_SIMILARITY = "sentence-similarity"
TEXT_CLASSIFICATION = "text-classification"
TOKEN_CLASSIFICATION = "token-classification"
IMAGE_CLASSIFICATION = "image-classification"
OBJECT_DETECTION = "object-detection"
SPEECH_RECOGNITION = "automatic-speech-recognition"
IMAGE_SEGMENTATION = "image-segmentation"
DEPTH_ESTIMATION = "depth-estimation"
IMAGE_TEXT_TO_TEXT = "image-text-to-text"
AUDIO_TEXT_TO_TEXT = "audio-text-to-text"

#: Tasks this version runs: chat through ``generate``; the others through ``run``.
TASKS = (
    TEXT_GENERATION,
    IMAGE_TEXT_TO_TEXT,
    AUDIO_TEXT_TO_TEXT,
    FEATURE_EXTRACTION,
    SENTENCE_SIMILARITY,
    TEXT_CLASSIFICATION,
    TOKEN_CLASSIFICATION,
    IMAGE_CLASSIFICATION,
    OBJECT_DETECTION,
    IMAGE_SEGMENTATION,
    DEPTH_ESTIMATION,
    SPEECH_RECOGNITION,
)
#: Tasks that chat through ``generate``: a text-only decoder, or one graph per module with a vision or audio encoder.
CHAT_TASKS = (TEXT_GENERATION, IMAGE_TEXT_TO_TEXT, AUDIO_TEXT_TO_TEXT)
#: Tasks whose graph takes ``pixel_values``, prepared as ``preprocessor_config.json`` says.
IMAGE_TASKS = (IMAGE_CLASSIFICATION, OBJECT_DETECTION, IMAGE_SEGMENTATION, DEPTH_ESTIMATION)
#: Speech models (config.json ``model_type``) whose encoder-decoder export and log-mel front end are read.
WHISPER_STYLE = ("whisper",)
#: Detection heads (config.json ``model_type``) whose output is read: a softmax over the classes and
#: a last "no object" class, with normalised centre/size boxes.
DETR_STYLE = ("detr", "yolos", "table-transformer")
#: Segmentation heads (config.json ``architectures``) whose output is read besides ``…ForSemanticSegmentation``:
#: per query, class logits and mask logits, post-processed as Mask2Former's image processor does.
MASK_SEGMENTATION_HEADS = ("Mask2FormerForUniversalSegmentation",)
#: Tasks whose graph is an encoder giving one vector per token, pooled into embeddings.
EMBEDDING_TASKS = (FEATURE_EXTRACTION, SENTENCE_SIMILARITY)
#: Tasks whose graph is an encoder with a classification head (``logits``).
CLASSIFICATION_TASKS = (TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION)

# config.json ``architectures`` suffixes and the task they mean.
_ARCHITECTURE_TASKS = (
    ("ForCausalLM", TEXT_GENERATION),
    ("LMHeadModel", TEXT_GENERATION),
    ("ForSequenceClassification", TEXT_CLASSIFICATION),
    ("ForTokenClassification", TOKEN_CLASSIFICATION),
    ("ForImageClassification", IMAGE_CLASSIFICATION),
    ("ForObjectDetection", OBJECT_DETECTION),
    ("ForSemanticSegmentation", IMAGE_SEGMENTATION),
    ("ForUniversalSegmentation", IMAGE_SEGMENTATION),
    ("ForInstanceSegmentation", IMAGE_SEGMENTATION),
    ("ForDepthEstimation", DEPTH_ESTIMATION),
    ("WhisperForConditionalGeneration", SPEECH_RECOGNITION),
    ("ForSpeechSeq2Seq", SPEECH_RECOGNITION),
    ("ForCTC", SPEECH_RECOGNITION),
    ("AudioForConditionalGeneration", AUDIO_TEXT_TO_TEXT),  # Qwen2-Audio
    ("ForConditionalGeneration", IMAGE_TEXT_TO_TEXT),
    ("Model", FEATURE_EXTRACTION),
)


def task_of(model: Model, requested: str | None) -> str:
    """The task to run: the request's, the model's own, else one read from its tags, files and config."""
    if requested:
        return requested
    if declares_per_layer_inputs(model.config) and module_graphs(model):
        # Gemma 3n / Gemma 4 small, one graph per module: text chat, with the media whose encoders are read.
        read = media_encoders(model)
        if "vision_encoder" in read:
            return IMAGE_TEXT_TO_TEXT
        return AUDIO_TEXT_TO_TEXT if read else TEXT_GENERATION
    if model.task:
        return model.task
    if "sentence-transformers" in model.tags or any(f.name == "modules.json" for f in model.files):
        return FEATURE_EXTRACTION
    if model.config.get("model_type") in WHISPER_STYLE:  # its repos hold a decoder_model_merged too
        return SPEECH_RECOGNITION
    stems = [f.name.rsplit("/", 1)[-1] for f in model.files]
    if any(stem.startswith("vision_encoder") for stem in stems):
        return IMAGE_TEXT_TO_TEXT  # one graph per module with a vision encoder: chat with images (and audio)
    if any(stem.startswith("audio_encoder") for stem in stems):
        return AUDIO_TEXT_TO_TEXT  # one graph per module with an audio encoder only: chat with audio
    if any("decoder_model_merged" in f.name for f in model.files):
        return TEXT_GENERATION
    architectures = model.config.get("architectures")
    if isinstance(architectures, list):
        for name in architectures:
            if not isinstance(name, str):
                continue
            for suffix, task in _ARCHITECTURE_TASKS:
                if name.endswith(suffix):
                    return task
    return TEXT_GENERATION
