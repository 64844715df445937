"""From a description to an encoder handle: embeddings (``AutoModel``) or classification (a head's ``Auto`` class).

The tokenizer is the repo's ``tokenizer.json`` read by the ``tokenizers`` library (no Python
tokenizer code). The longest text read is sentence-transformers' ``max_seq_length`` where the
repo has one (what sentence-transformers cuts at), else ``tokenizer_config.json``'s
``model_max_length``, never past the positions the model has.
"""

from __future__ import annotations

import json
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
    fetch_files,
    read_config_json,
)
from anyformer_transformers import BACKEND_ID
from anyformer_transformers.classifier_model import ClassifierModel
from anyformer_transformers.embedding_model import EmbeddingModel, pooling_of
from anyformer_transformers.encoder import Encoder
from anyformer_transformers.estimate import Plan
from anyformer_transformers.loading import build_network, folder_of
from anyformer_transformers.model_files import MODULES, POOLING_CONFIG, SENTENCE_CONFIG
from anyformer_transformers.placement import describe
from anyformer_transformers.tasks import EMBEDDING_TASKS, TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION

#: sentence-transformers' modules whose work the embedding handle does (the network, pooling, unit length).
_APPLIED = ("Transformer", "Pooling", "Normalize")
_MAX_MODULES_BYTES = 2**20
#: ``model_max_length`` values at or past this mean "no limit" (transformers writes 1e30 there).
_NO_LIMIT = 10**7


def _config(paths: Mapping[str, Path], name: str, model: Model) -> dict[str, Any]:
    return read_config_json(paths[name], f"{name} of {model.ref}") if name in paths else {}


def _positive(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < _NO_LIMIT:
        return value
    return None


def max_tokens(limit: int, sentence: Mapping[str, Any], tokenizer: Mapping[str, Any]) -> int:
    """The longest text read, in tokens: ``max_seq_length``, else ``model_max_length``, at most ``limit``."""
    wanted = _positive(sentence.get("max_seq_length")) or _positive(tokenizer.get("model_max_length"))
    return min(wanted, limit) if wanted else limit


def check_modules(paths: Mapping[str, Path], model: Model) -> None:
    """``BAD_MODEL`` when sentence-transformers' ``modules.json`` lists a module this backend does not apply
    (a ``Dense`` projection, a router…): its vectors would differ from the model's own."""
    if MODULES not in paths:
        return
    try:
        if paths[MODULES].stat().st_size > _MAX_MODULES_BYTES:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{MODULES} of {model.ref} is over 1 MiB; not a module list")
        modules = json.loads(paths[MODULES].read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{MODULES} of {model.ref} is not readable JSON", cause=exc) from exc
    kinds = [m.get("type") if isinstance(m, dict) else m for m in modules] if isinstance(modules, list) else [modules]
    foreign = [str(kind) for kind in kinds if not isinstance(kind, str) or kind.rsplit(".", 1)[-1] not in _APPLIED]
    if foreign:
        raise AnyformerError(
            ErrorCode.BAD_MODEL,
            f"{model.ref}: its {MODULES} has {', '.join(foreign)[:200]}, which this backend does not apply "
            f"(it applies {', '.join(_APPLIED)})",
        )


def _auto_class(task: str) -> Any:
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoModelForTokenClassification

    if task == TEXT_CLASSIFICATION:
        return AutoModelForSequenceClassification
    if task == TOKEN_CLASSIFICATION:
        return AutoModelForTokenClassification
    return AutoModel


def load_encoder_model(
    model: Model, task: str, names: list[str], plan: Plan, progress: ProgressCallback
) -> BackendModel:
    """Fetch ``names`` and build the encoder for ``task`` in ``plan.dtype`` where ``plan`` places it."""
    paths = fetch_files(model, names, progress, backend=BACKEND_ID)
    folder = folder_of(paths)
    progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=str(folder.name), done=0, total=None))
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(paths["tokenizer.json"]))
    except Exception as exc:  # tokenizers raises a plain Exception on a bad file
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"{model.ref}: tokenizer.json is not readable: {exc}", cause=exc
        ) from exc
    pooling = None
    if task in EMBEDDING_TASKS:  # before the weights are read: what cannot be applied fails fast
        check_modules(paths, model)
        pooling = pooling_of(_config(paths, POOLING_CONFIG, model), model.ref)
    network = build_network(_auto_class(task), folder, plan, model)
    config = network.config.to_dict()
    limit = max_tokens(
        plan.context, _config(paths, SENTENCE_CONFIG, model), _config(paths, "tokenizer_config.json", model)
    )
    pad_id = config.get("pad_token_id")
    encoder = Encoder(
        network, tokenizer, max_tokens=limit, pad_id=pad_id if isinstance(pad_id, int) else 0, label=model.ref
    )
    details: dict[str, Any] = {
        **describe(plan),
        "class": type(network).__name__,
        "max_tokens": limit,
    }
    progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=str(folder.name), done=1, total=1))
    if pooling is not None:
        details["pooling"] = pooling
        return EmbeddingModel(encoder, task=task, pooling=pooling, details=details)
    return ClassifierModel(encoder, task=task, config=config, details=details)
