"""The Hub task names this backend's families answer (which family runs which: :mod:`anyformer_onnx.tasks.registry`)."""

from __future__ import annotations

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
