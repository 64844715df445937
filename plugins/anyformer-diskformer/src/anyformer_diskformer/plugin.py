"""The anyformer hooks of the diskformer backend. Nothing heavy is imported here.

``can_run`` decides from the description (the core read the GGUF's header; when the file is on disk
its tensor sizes give exact figures): the format, the task, whether the engine reads the MoE
architecture, every weight type and the tokenizer, and whether dense weights + the KV cache + the
smallest working expert cache (one layer's top-k experts) fit host memory (``caps.ram_bytes``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from anyformer import (
    BackendModel,
    Caps,
    Chunk,
    Estimate,
    GenerateOptions,
    Message,
    Model,
    ModelFile,
    ProgressCallback,
    Rank,
    Refusal,
    Request,
    StoreEntry,
    Verdict,
    format_size,
    hookimpl,
)
from anyformer_diskformer import BACKEND_ID

TASK = "text-generation"
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


def choose_gguf(model: Model) -> tuple[ModelFile, dict[str, object]] | str:
    """The language-model GGUF and its header summary from the description, or why there is none to run."""
    ggufs = [f for f in model.files_of("gguf") if "mmproj" not in f.name.lower()]
    if not ggufs:
        return "no language-model GGUF (only projectors)"
    name = model.metadata.get("gguf_file")
    chosen = model.file(name) if isinstance(name, str) else (ggufs[0] if len(ggufs) == 1 else None)
    summary = model.metadata.get("gguf")
    if chosen is None or not isinstance(summary, dict):
        return "the GGUF's header was not read (no header facts in the description)"
    if _SPLIT.search(chosen.name) or summary.get("split"):
        return f"{chosen.name} is one shard of a split set, which this engine does not read"
    return chosen, summary


def header_problem(summary: dict[str, object]) -> str | None:
    """Why the engine does not read this GGUF (architecture, weight types, tokenizer), or None."""
    from anyformer_diskformer.moe_config import moe_problem
    from anyformer_gguf_gpu.tokenizer import PRE_TOKENIZERS

    problem = moe_problem(summary)
    if problem is not None:
        return problem
    tok_model, pre = summary.get("tokenizer_model"), summary.get("tokenizer_pre")
    if tok_model != "gpt2":
        return f"tokenizer model {tok_model!r} (only byte-level BPE, 'gpt2', is read)"
    if pre not in PRE_TOKENIZERS:
        return f"pre-tokenizer {pre!r} is not one this engine splits like llama.cpp"
    return None


@hookimpl
def can_run(model: Model, caps: Caps, request: Request) -> Verdict:
    """Refuse with ``format``/``task``/``model``/``store``/``memory``, or estimate the host memory it holds."""
    if "gguf" not in model.formats:
        return Verdict.refuse(BACKEND_ID, Refusal.FORMAT, "no GGUF in the repo")
    task = request.task or model.task or TASK
    if task != TASK:
        return Verdict.refuse(BACKEND_ID, Refusal.TASK, f"runs {TASK} only, not {task}")
    choice = choose_gguf(model)
    if isinstance(choice, str):
        return Verdict.refuse(BACKEND_ID, Refusal.MODEL, choice)
    file, summary = choice
    problem = header_problem(summary)
    if problem is not None:
        return Verdict.refuse(BACKEND_ID, Refusal.MODEL, f"{file.name}: {problem}")
    if model.source == "hub" and file.path is None and not caps.store:
        return Verdict.refuse(
            BACKEND_ID, Refusal.STORE, f"{file.name} must be downloaded and the model store is not writable"
        )
    from anyformer_diskformer.plan import context_for, plan_for

    context = context_for(summary, request.context)
    plan = plan_for(file.path, summary, context)
    how = " (estimated from the architecture and the file size: the header's tensors were not read)"
    how = how if plan.estimated else ""
    parts = (
        f"dense weights {format_size(plan.dense_bytes)}, KV cache {format_size(plan.kv_bytes)} at {context} tokens, "
        f"one layer's top-{plan.experts_per_token} experts {format_size(plan.min_cache_bytes)}"
    )
    # The CPU engine holds everything in host memory, so host memory (``caps.ram_bytes``) is the limit;
    # the request's ``budget`` is accelerator memory, which this engine does not use.
    if plan.need > caps.ram_bytes:
        return Verdict.refuse(
            BACKEND_ID,
            Refusal.MEMORY,
            f"{file.name}: needs at least {format_size(plan.need)} of memory ({parts}){how}; "
            f"{format_size(caps.ram_bytes)} available",
            need=plan.need,
        )
    pool = request.options.get("pool_bytes")
    cache = plan.cache_bytes(caps.ram_bytes)
    if isinstance(pool, int) and not isinstance(pool, bool) and pool > 0:
        # An explicit pool replaces what memory leaves (load refuses one below the smallest working cache).
        cache = min(pool, cache)
    return Verdict.accept(
        BACKEND_ID,
        Estimate(
            gpu_bytes=0,
            ram_bytes=plan.fixed_bytes + cache,
            disk_bytes=file.size or 0,
            tok_per_sec=None,
            rank=Rank.SPECIALIST,
            details={
                "file": file.name,
                "architecture": summary.get("architecture"),
                "context": context,
                "device": "cpu",
                "dense_bytes": plan.dense_bytes,
                "kv_cache": plan.kv_bytes,
                "expert_cache": cache,
                "experts_total": plan.expert_bytes_total,
                "estimated": plan.estimated,
            },
            files=(file.name,),
        ),
    )


@hookimpl
def load(backend: str, model: Model, request: Request, progress: ProgressCallback) -> BackendModel | None:
    """Fetch the GGUF, keep its dense tensors resident and open the expert cache."""
    if backend != BACKEND_ID:
        return None
    from anyformer_diskformer.engine import DiskformerModel

    return DiskformerModel.open(model, request, progress)


@hookimpl
def generate(loaded: BackendModel, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk] | None:
    """Stream a chat reply from a model this backend loaded."""
    if loaded.backend != BACKEND_ID:
        return None
    from anyformer_diskformer.engine import DiskformerModel

    assert isinstance(loaded, DiskformerModel)
    return loaded.stream(messages, options)


@hookimpl
def store_list() -> list[StoreEntry]:
    """Nothing: the GGUFs live in the Hugging Face cache (listed by the core); nothing is derived."""
    return []
