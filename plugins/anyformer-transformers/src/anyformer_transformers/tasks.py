"""The tasks this backend runs, the auto-model table each is built from, and a model's task when none is asked.

Chat goes through ``generate``; every other task through the handle's ``run``, with the return
shapes of the ONNX backend's handles (which are transformers' pipelines' shapes).
"""

from __future__ import annotations

from anyformer.plugin import Model, Request

TEXT_GENERATION = "text-generation"
FEATURE_EXTRACTION = "feature-extraction"
SENTENCE_SIMILARITY = "sentence-similarity"
TEXT_CLASSIFICATION = "text-classification"
TOKEN_CLASSIFICATION = "token-classification"
IMAGE_CLASSIFICATION = "image-classification"
OBJECT_DETECTION = "object-detection"
IMAGE_SEGMENTATION = "image-segmentation"
DEPTH_ESTIMATION = "depth-estimation"
SPEECH_RECOGNITION = "automatic-speech-recognition"
IMAGE_TEXT_TO_TEXT = "image-text-to-text"

#: Tasks whose handle pools an encoder's hidden states into embeddings.
EMBEDDING_TASKS = (FEATURE_EXTRACTION, SENTENCE_SIMILARITY)
#: Tasks whose handle reads a classification head's logits.
CLASSIFICATION_TASKS = (TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION)
#: Tasks that chat through ``generate``: a causal LM, or a vision-language model with its processor.
CHAT_TASKS = (TEXT_GENERATION, IMAGE_TEXT_TO_TEXT)
#: Tasks whose handle reads images through the model's image processor (``preprocessor_config.json``).
IMAGE_TASKS = (IMAGE_CLASSIFICATION, OBJECT_DETECTION, IMAGE_SEGMENTATION, DEPTH_ESTIMATION)
#: Tasks whose handle reads audio through the model's feature extractor: Whisper-style encoder-decoders.
AUDIO_TASKS = (SPEECH_RECOGNITION,)
#: Tasks that read a tokenizer.json (a vision model has none; a speech model decodes its tokens with one).
TOKENIZER_TASKS = (*CHAT_TASKS, *EMBEDDING_TASKS, *CLASSIFICATION_TASKS, *AUDIO_TASKS)
#: Every task this version runs.
TASKS = (*CHAT_TASKS, *EMBEDDING_TASKS, *CLASSIFICATION_TASKS, *IMAGE_TASKS, *AUDIO_TASKS)

#: The auto-model table (``installed.TABLES``' key) that builds each task's network.
TABLE_OF = {
    TEXT_GENERATION: TEXT_GENERATION,
    FEATURE_EXTRACTION: FEATURE_EXTRACTION,
    SENTENCE_SIMILARITY: FEATURE_EXTRACTION,  # the same bare encoder; run scores the pooled vectors
    TEXT_CLASSIFICATION: TEXT_CLASSIFICATION,
    TOKEN_CLASSIFICATION: TOKEN_CLASSIFICATION,
    IMAGE_CLASSIFICATION: IMAGE_CLASSIFICATION,
    OBJECT_DETECTION: OBJECT_DETECTION,
    IMAGE_SEGMENTATION: IMAGE_SEGMENTATION,
    DEPTH_ESTIMATION: DEPTH_ESTIMATION,
    SPEECH_RECOGNITION: SPEECH_RECOGNITION,
    IMAGE_TEXT_TO_TEXT: IMAGE_TEXT_TO_TEXT,
}

# config.json ``architectures`` suffixes and the task they mean, the most specific first.
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
    ("ForConditionalGeneration", IMAGE_TEXT_TO_TEXT),  # LLaVA, Qwen2-VL, Gemma 3, Idefics…
    ("Model", FEATURE_EXTRACTION),
)


def task_of(model: Model, request: Request) -> str:
    """The task asked for, else the repo's own, else one read from its files and config, else text generation."""
    if request.task:
        return request.task
    if model.task:
        return model.task
    if "sentence-transformers" in model.tags or model.file("modules.json") is not None:
        return FEATURE_EXTRACTION
    architectures = model.config.get("architectures")
    if isinstance(architectures, list):
        for name in architectures:
            for suffix, task in _ARCHITECTURE_TASKS:
                if isinstance(name, str) and name.endswith(suffix):
                    return task
    return TEXT_GENERATION
