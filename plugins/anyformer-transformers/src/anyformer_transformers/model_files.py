"""Which files of a repo this backend reads: config.json, the root safetensors, the tokenizer, the preprocessor."""

from __future__ import annotations

from anyformer.plugin import Model, ModelFile

#: The text side and settings files read when present (``can_run`` says which a task requires:
#: tokenizer.json for text, preprocessor_config.json for images and audio).
SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "preprocessor_config.json",
    "processor_config.json",
    "chat_template.json",
    "model.safetensors.index.json",
)
#: sentence-transformers' settings, read for the embedding tasks: its modules, the pooling and the longest text read.
MODULES = "modules.json"
POOLING_CONFIG = "1_Pooling/config.json"
SENTENCE_CONFIG = "sentence_bert_config.json"
EMBEDDING_FILES = (MODULES, POOLING_CONFIG, SENTENCE_CONFIG)


def weight_files(model: Model) -> tuple[ModelFile, ...]:
    """The safetensors files at the repo's root: the checkpoint ``from_pretrained`` reads.

    Files in folders (``original/``, ``onnx/``, adapters) belong to other loaders and are never fetched.
    """
    return tuple(f for f in model.files_of("safetensors") if "/" not in f.name)


def files_to_read(model: Model, embeddings: bool = False) -> list[str]:
    """Every repo file a load reads, in the order they are fetched (the settings first, the weights last).

    ``embeddings``: for an embedding task, sentence-transformers' settings too.
    """
    wanted = (*SIDE_FILES, *EMBEDDING_FILES) if embeddings else SIDE_FILES
    side = [name for name in wanted if model.file(name) is not None]
    return [*side, *(f.name for f in weight_files(model))]
