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

#: Tasks whose handle pools an encoder's hidden states into embeddings.
EMBEDDING_TASKS = (FEATURE_EXTRACTION, SENTENCE_SIMILARITY)
#: Tasks whose handle reads a classification head's logits.
CLASSIFICATION_TASKS = (TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION)
#: Every task this version runs.
TASKS = (TEXT_GENERATION, *EMBEDDING_TASKS, *CLASSIFICATION_TASKS)

#: The auto-model table (``installed.TABLES``' key) that builds each task's network.
TABLE_OF = {
    TEXT_GENERATION: TEXT_GENERATION,
    FEATURE_EXTRACTION: FEATURE_EXTRACTION,
    SENTENCE_SIMILARITY: FEATURE_EXTRACTION,  # the same bare encoder; run scores the pooled vectors
    TEXT_CLASSIFICATION: TEXT_CLASSIFICATION,
    TOKEN_CLASSIFICATION: TOKEN_CLASSIFICATION,
}

# config.json ``architectures`` suffixes and the task they mean, the most specific first.
_ARCHITECTURE_TASKS = (
    ("ForCausalLM", TEXT_GENERATION),
    ("LMHeadModel", TEXT_GENERATION),
    ("ForSequenceClassification", TEXT_CLASSIFICATION),
    ("ForTokenClassification", TOKEN_CLASSIFICATION),
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
