"""The transformers backend's hooks (docs/backends/transformers.md); the ``anyformer`` entry point ``transformers``.

- ``can_run`` decides from the description and config.json: safetensors weights, a class for the
  task in the installed transformers (``tasks.py``' tables), no code from the repo, the files the
  task reads (tokenizer, preprocessor), and where it fits (``placement.py``: a GPU the caps list and
  torch drives, whole or split with host memory by accelerate, else host memory) for the weights
  and the KV cache (chat), one batch (encoders) or one input (vision, speech). It imports neither
  torch nor transformers (``installed.py`` reads their tables as text).
- ``load`` fetches the settings, tokenizer, processor and root safetensors files, then builds the
  model with ``from_pretrained`` (``trust_remote_code=False``, safetensors only) in the dtype and
  on the device ``placement.place`` chooses from what torch sees now.
- ``generate`` streams through the chat handle's own KV-cache loop (``chat_model.py``, with images
  ``image_chat_model.py``); the other tasks' handles answer ``run`` (``embedding_model.py``,
  ``classifier_model.py``, ``vision_model.py``, ``speech_model.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from anyformer.plugin import (
    AnyformerError,
    BackendModel,
    Caps,
    ErrorCode,
    Estimate,
    LoadOptions,
    Model,
    ProgressCallback,
    Rank,
    Refusal,
    Request,
    StoreEntry,
    Verdict,
    format_size,
    hookimpl,
    host_ram_available,
)
from anyformer_transformers import BACKEND_ID
from anyformer_transformers.estimate import Plan, Shape, encoder_plans, media_plans, plans, stored_dtype
from anyformer_transformers.installed import installed
from anyformer_transformers.model_files import files_to_read, weight_files
from anyformer_transformers.placement import caps_gpu, describe, place, torch_gpu
from anyformer_transformers.tasks import (
    AUDIO_TASKS,
    CHAT_TASKS,
    EMBEDDING_TASKS,
    IMAGE_TASKS,
    IMAGE_TEXT_TO_TEXT,
    TABLE_OF,
    TASKS,
    TOKENIZER_TASKS,
    task_of,
)

#: config.json keys that mean the checkpoint is quantised by a library this backend does not load.
_QUANTIZED = "quantization_config"
#: No load options: the core refuses any key (its run and generate options are checked where they are read).
LOAD_OPTIONS = LoadOptions()


def text_shape(config: Mapping[str, Any]) -> Shape | None:
    """The language model's shape: config.json's own, or its ``text_config``'s (a vision-language model)."""
    inner = config.get("text_config")
    return Shape.of(inner) if isinstance(inner, Mapping) and Shape.of(config) is None else Shape.of(config)


#: The speech models (config.json ``model_type``) whose feature extractor and ``generate`` are driven.
WHISPER_STYLE = ("whisper",)


def _plans(
    model: Model, task: str, shape: Shape | None, weight_bytes: int, request: Request, dtypes: tuple[str, ...] | None
) -> list[Plan]:
    """The ways to hold the model for ``task`` in host memory, in ``dtypes`` (None: the CPU's): with a KV
    cache for chat, one batch of texts for an encoder, one image or clip for a vision or speech model."""
    if task in IMAGE_TASKS or task in AUDIO_TASKS:
        return media_plans(model.config, weight_bytes, dtypes)
    assert shape is not None  # checked by the caller for the text tasks
    if task in CHAT_TASKS:
        return plans(model.config, weight_bytes, shape, request.context, dtypes)
    return encoder_plans(model.config, weight_bytes, shape, dtypes)


def _model_problem(model: Model, config: Mapping[str, Any], task: str) -> str | None:
    """Why this checkpoint cannot be built with the installed transformers, or None when it can."""
    if "auto_map" in config:
        return "its config.json maps to code in the repo (trust_remote_code), which anyformer never runs"
    if _QUANTIZED in config:
        method = config[_QUANTIZED].get("quant_method") if isinstance(config[_QUANTIZED], Mapping) else None
        return f"its weights are quantised ({method or 'quantization_config'}); this backend loads plain weights"
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        return "its config.json names no model_type"
    have = installed()
    assert have is not None  # checked by the caller
    if have.class_for(TABLE_OF[task], model_type) is None:
        return (
            f"transformers {have.transformers} has no {task} class for model_type {model_type!r}; "
            "a newer transformers may have it (pip install -U transformers)"
        )
    if task in AUDIO_TASKS and model_type not in WHISPER_STYLE:
        return f"speech recognition runs Whisper-style models ({', '.join(WHISPER_STYLE)}), not {model_type!r}"
    if task in TOKENIZER_TASKS and model.file("tokenizer.json") is None:
        return "no tokenizer.json (this backend reads fast tokenizers only, never Python tokenizer code)"
    if (task in IMAGE_TASKS or task in AUDIO_TASKS) and model.file("preprocessor_config.json") is None:
        return "no preprocessor_config.json (how its images or audio are prepared)"
    if task == IMAGE_TEXT_TO_TEXT and not any(
        model.file(n) for n in ("processor_config.json", "preprocessor_config.json")
    ):
        return "no processor_config.json or preprocessor_config.json (how its images are prepared)"
    return None


@hookimpl
def can_run(model: Model, caps: Caps, request: Request) -> Verdict:
    """Accept a safetensors model for one of ``TASKS`` that the installed transformers builds and host memory holds."""
    weights = weight_files(model)
    if not weights:
        return Verdict.refuse(BACKEND_ID, Refusal.FORMAT, f"no safetensors weights at the root of {model.ref}")
    if model.file("config.json") is None:
        return Verdict.refuse(BACKEND_ID, Refusal.FORMAT, f"{model.ref} has safetensors but no config.json")
    task = task_of(model, request)
    if task not in TASKS:
        return Verdict.refuse(BACKEND_ID, Refusal.TASK, f"runs {', '.join(TASKS)}, not {task}")
    have = installed()
    if have is None:
        return Verdict.refuse(
            BACKEND_ID,
            Refusal.RUNTIME,
            "torch and transformers are not both installed (pip install torch transformers)",
        )
    config = model.config
    problem = _model_problem(model, config, task)
    if problem is not None:
        return Verdict.refuse(BACKEND_ID, Refusal.MODEL, problem)
    shape = text_shape(config)
    if shape is None and task not in IMAGE_TASKS and task not in AUDIO_TASKS:
        return Verdict.refuse(BACKEND_ID, Refusal.MODEL, "config.json lacks the layer, head or hidden sizes")
    if any(f.size is None for f in weights):
        return Verdict.refuse(BACKEND_ID, Refusal.MODEL, "the listing gives no size for every safetensors file")
    weight_bytes = sum(f.size or 0 for f in weights)
    names = files_to_read(model, embeddings=task in EMBEDDING_TASKS)
    gpu, why = caps_gpu(caps, have, request.budget)
    plan, candidates = place(
        lambda dtypes: _plans(model, task, shape, weight_bytes, request, dtypes),
        stored_dtype(config),
        gpu,
        caps.ram_bytes,
    )
    if plan is None and gpu is not None and gpu.budget is not None:
        whole = candidates[0]
        return Verdict.refuse(
            BACKEND_ID,
            Refusal.BUDGET,
            f"needs {format_size(whole.gpu_bytes)} on the GPU ({whole.dtype}), {format_size(gpu.budget)} is offered; "
            + (
                "the host memory cannot hold the weights a split would leave there either"
                if gpu.can_split
                else "a split with host memory needs accelerate (pip install accelerate)"
                if gpu.device == "cuda"
                else "the CPU's host memory cannot hold it either"
            ),
            need=whole.gpu_bytes,
        )
    if plan is None:
        least = min((p for p in candidates if p.device == "cpu"), key=lambda p: p.ram_bytes)
        if task in CHAT_TASKS:
            held = f"{least.context} positions of KV cache"
        elif task in IMAGE_TASKS or task in AUDIO_TASKS:
            held = "one input's activations"
        else:
            held = f"a batch of texts of {least.context} tokens"
        return Verdict.refuse(
            BACKEND_ID,
            Refusal.MEMORY,
            f"needs {format_size(least.ram_bytes)} of host memory ({least.dtype} weights, {held}), "
            f"{format_size(caps.ram_bytes)} available",
            need=least.ram_bytes,
        )
    details: dict[str, Any] = {
        **describe(plan),
        "class": have.class_for(TABLE_OF[task], str(config["model_type"])),
        "transformers": have.transformers,
    }
    if why:
        details["gpu"] = why
    elif gpu is not None and plan.device == "cpu":
        details["gpu"] = (
            f"{format_size(candidates[0].gpu_bytes)} on the GPU is more than the {format_size(gpu.budget or 0)} offered"
        )
    if task in CHAT_TASKS:
        details["context"] = plan.context
    elif task not in IMAGE_TASKS and task not in AUDIO_TASKS:
        details["max_tokens"] = plan.context
    return Verdict.accept(
        BACKEND_ID,
        Estimate(
            gpu_bytes=plan.gpu_bytes,
            ram_bytes=plan.ram_bytes,
            disk_bytes=weight_bytes,
            rank=Rank.FALLBACK,
            details=details,
            files=tuple(names),
            inputs=("image",) if task == IMAGE_TEXT_TO_TEXT else (),
        ),
    )


@hookimpl
def load(model: Model, request: Request, progress: ProgressCallback) -> BackendModel:
    """Fetch the files and build the model in the dtype that fits the host memory available now."""
    task = task_of(model, request)
    if task not in TASKS:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"task {task}; the {BACKEND_ID} backend runs {', '.join(TASKS)}")
    shape = text_shape(model.config)
    media = task in IMAGE_TASKS or task in AUDIO_TASKS
    if (shape is None and not media) or not weight_files(model):
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{model.ref}: no safetensors weights with a usable config.json")
    weight_bytes = sum(f.size or 0 for f in weight_files(model))
    # As can_run chose, on the GPU torch sees and the memory free now; when nothing fits, the smallest
    # host plan is tried (OUT_OF_MEMORY if not).
    plan, candidates = place(
        lambda dtypes: _plans(model, task, shape, weight_bytes, request, dtypes),
        stored_dtype(model.config),
        torch_gpu(request.budget),
        host_ram_available(),
    )
    if plan is None:
        plan = min((p for p in candidates if p.device == "cpu"), key=lambda p: p.ram_bytes)
    names = files_to_read(model, embeddings=task in EMBEDDING_TASKS)
    if task in CHAT_TASKS:
        from anyformer_transformers.loading import load_chat_model

        return load_chat_model(model, task, names, plan, progress)
    if media:
        from anyformer_transformers.media_loading import load_media_model

        return load_media_model(model, task, names, plan, progress)
    from anyformer_transformers.encoder_loading import load_encoder_model

    return load_encoder_model(model, task, names, plan, progress)


@hookimpl
def store_list() -> list[StoreEntry]:
    """This backend keeps nothing outside the Hugging Face cache."""
    return []
