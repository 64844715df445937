"""From a description to a handle: fetch the files, build the tokenizer and the model with transformers.

Nothing from the repo runs: ``trust_remote_code=False`` (``can_run`` refused repos that need it),
weights from safetensors only, the tokenizer from ``tokenizer.json``, and the chat template is
rendered later by the core's sandbox, never by the tokenizer's own jinja environment.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from anyformer.plugin import AnyformerError, ErrorCode, Model, ProgressCallback, ProgressEvent, fetch_files
from anyformer_transformers import BACKEND_ID
from anyformer_transformers.chat_model import ChatModel, TextSide
from anyformer_transformers.estimate import Plan
from anyformer_transformers.placement import describe
from anyformer_transformers.tasks import IMAGE_TEXT_TO_TEXT


def folder_of(paths: dict[str, Path]) -> Path:
    """The one folder the fetched files share (a snapshot of the Hub cache, or the local model folder)."""
    folders = {path.parent for name, path in paths.items() if "/" not in name}
    if len(folders) != 1:
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"the model's files are in several folders: {sorted(map(str, folders))}"
        )
    return folders.pop()


def build_network(auto_class: Any, folder: Path, plan: Plan, model: Model) -> Any:
    """``auto_class.from_pretrained`` on ``folder`` in ``plan.dtype``, where ``plan`` places it (the device,
    or accelerate's split), from safetensors, no repo code; in eval mode."""
    import torch

    try:
        network = auto_class.from_pretrained(
            str(folder),
            dtype=getattr(torch, plan.dtype),
            local_files_only=True,
            trust_remote_code=False,
            use_safetensors=True,
            **plan.load_options(),
        )
    except MemoryError as exc:
        raise AnyformerError(
            ErrorCode.OUT_OF_MEMORY, f"{model.ref}: out of host memory while loading", cause=exc
        ) from exc
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"{model.ref}: transformers cannot load it: {exc}", cause=exc
        ) from exc
    return network.eval()


def load_chat_model(model: Model, task: str, names: list[str], plan: Plan, progress: ProgressCallback) -> ChatModel:
    """Fetch ``names`` and build the causal LM (or, for image-text-to-text, the vision-language model and
    its processor) in ``plan.dtype`` where ``plan`` places it."""
    paths = fetch_files(model, names, progress, backend=BACKEND_ID)
    folder = folder_of(paths)
    progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=str(folder.name), done=0, total=None))
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoProcessor,
        AutoTokenizer,
        GenerationConfig,
    )

    processor: Any = None
    try:
        if task == IMAGE_TEXT_TO_TEXT:
            processor = AutoProcessor.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
            tokenizer: Any = processor.tokenizer
        else:
            tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError, AttributeError) as exc:
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"{model.ref}: transformers cannot load its tokenizer or processor: {exc}", cause=exc
        ) from exc
    auto = AutoModelForImageTextToText if task == IMAGE_TEXT_TO_TEXT else AutoModelForCausalLM
    network = build_network(auto, folder, plan, model)
    try:
        generation = GenerationConfig.from_pretrained(str(folder), local_files_only=True)
    except OSError:  # no generation_config.json: the model's config holds the defaults
        generation = network.generation_config
    text = TextSide.of(tokenizer, generation)
    details = {**describe(plan), "class": type(network).__name__, "context": plan.context}
    progress(ProgressEvent(stage="load", backend=BACKEND_ID, file=str(folder.name), done=1, total=1))
    if processor is not None:
        from anyformer_transformers.image_chat_model import ImageChatModel

        template = getattr(processor, "chat_template", None)
        if isinstance(template, str):  # the processor's template (chat_template.jinja/json) is the one for images
            text = dataclasses.replace(text, template=template)
        return ImageChatModel(network, text, processor, context=plan.context, details=details)
    return ChatModel(network, text, context=plan.context, details=details)
