"""Which GGUF of a described model a GGUF engine backend would load, and the refusals every such backend shares.

The candidates, their quants and their header facts are the core's (``gguf_candidates``,
``gguf_facts``: read on demand, bounded, cached per commit); nothing here opens a model file.
What is the backend's own is passed in: its quant preference, the quants its kernels read, why an
engine does not run a header's model, and the budget arithmetic of its ``can_run`` (a *judge* of
one :class:`GgufChoice`). :func:`choose_and_judge` walks the backend's order until one fits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from anyformer.plugin import (
    AnyformerError,
    Caps,
    ErrorCode,
    GGUFCandidate,
    Model,
    ModelFile,
    ProgressCallback,
    ProgressEvent,
    Refusal,
    Request,
    Verdict,
    choose_gguf_candidate,
    fetch_files,
    gguf_candidates,
    host_ram_available,
    order_gguf_candidates,
)

#: The one task the GGUF engines run.
TEXT_GENERATION = "text-generation"
#: Repo tasks whose models chat in text too (Gemma 4, MiniCPM-V): a text-only engine runs them as text
#: chat when the request names no task (image or audio blocks are then refused, ``chat_setup``).
TEXT_CHAT_TASKS = ("image-text-to-text", "any-to-any")

#: Keys of config.json that give a header summary's facts when no header was read (a rough estimate).
_CONFIG_FACTS = {
    "num_hidden_layers": "block_count",
    "hidden_size": "embedding_length",
    "intermediate_size": "feed_forward_length",
    "num_attention_heads": "head_count",
    "num_key_value_heads": "head_count_kv",
    "head_dim": "key_length",
    "max_position_embeddings": "context_length",
    "vocab_size": "vocab_size",
    "num_experts": "expert_count",
    "num_local_experts": "expert_count",
    "num_experts_per_tok": "expert_used_count",
}


@dataclasses.dataclass(frozen=True)
class GgufChoice:
    """A candidate a backend judges, with its header summary; ``estimated``: no header was read.

    An estimated summary holds only what the description knows without a header: the
    architecture, config.json's dims, the Hub's context length and the files' bytes.
    """

    candidate: GGUFCandidate
    summary: dict[str, Any]
    estimated: bool = False

    @property
    def file(self) -> ModelFile:
        """The file a reader opens (a split set's first shard)."""
        return self.candidate.first

    @property
    def names(self) -> tuple[str, ...]:
        """Every file a load downloads."""
        return self.candidate.names

    @property
    def size(self) -> int:
        """Bytes of all its files."""
        return self.candidate.size


#: A backend's ``can_run`` arithmetic on one candidate.
Judge = Callable[[GgufChoice], Verdict]


def task_refusal(backend: str, model: Model, request: Request) -> Verdict | None:
    """``format`` without a GGUF, ``task`` for a task other than text chat, else None.

    A repo tagged with a :data:`TEXT_CHAT_TASKS` task runs as text chat when the request names no task.
    """
    if "gguf" not in model.formats:
        return Verdict.refuse(backend, Refusal.FORMAT, "no GGUF in the repo")
    task = request.task or model.task or TEXT_GENERATION
    if request.task is None and task in TEXT_CHAT_TASKS:
        task = TEXT_GENERATION
    if task != TEXT_GENERATION:
        return Verdict.refuse(backend, Refusal.TASK, f"runs {TEXT_GENERATION} only, not {task}")
    return None


#: Header facts every quant of one repo shares (one model, one tokenizer): a header read for another
#: file of the repo (the description's) tells them for a candidate whose own header was not read.
_REPO_WIDE_FACTS = (
    "architecture",
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "head_count",
    "head_count_kv",
    "key_length",
    "value_length",
    "expert_count",
    "expert_used_count",
    "vocab_size",
    "tokenizer_model",
    "tokenizer_pre",
    "rope_scaling",
    "parameter_count",
    "has_chat_template",
)


def rough_summary(model: Model, candidate: GGUFCandidate) -> dict[str, Any]:
    """What a header summary would say, from the description alone: architecture, config dims, file bytes.

    The repo-wide facts of the header the description read (another quant of the same model) come
    first; config.json's dimensions fill what it lacks.
    """
    described = model.metadata.get("gguf")
    summary: dict[str, Any] = {}
    if isinstance(described, dict):
        summary.update({key: described[key] for key in _REPO_WIDE_FACTS if described.get(key) is not None})
    summary.setdefault("architecture", model.architecture)
    summary["data_bytes"] = candidate.size
    for key, fact in _CONFIG_FACTS.items():
        value = model.config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            summary.setdefault(fact, value)
    hub = model.metadata.get("hub_gguf")
    if isinstance(hub, dict) and isinstance(hub.get("context_length"), int):
        summary.setdefault("context_length", hub["context_length"])
    return summary


def choose_and_judge(
    backend: str,
    model: Model,
    request: Request,
    *,
    preference: Sequence[str],
    readable_quants: Iterable[str],
    model_problem: Callable[[dict[str, Any]], str | None],
    judge: Judge,
) -> Verdict:
    """The backend's verdict: ``format``/``task`` first, then its candidates in its order until one is ``ok``.

    ``model_problem`` says why the engine does not run a summary's model (architecture, weight
    types); it also sees estimated summaries, which carry no weight types. The tokenizer is checked
    only where a header was read. A candidate without a header is judged on :func:`rough_summary`.
    """
    refused = task_refusal(backend, model, request)
    if refused is not None:
        return refused
    candidates = gguf_candidates(model)
    order = order_gguf_candidates(candidates, preference, readable_quants)
    if not order and request.options.get("file") is None:
        return Verdict.refuse(backend, Refusal.MODEL, _no_candidate(candidates, readable_quants))

    def judge_candidate(candidate: GGUFCandidate, facts: dict[str, Any] | None) -> Verdict:
        estimated = facts is None
        summary = rough_summary(model, candidate) if facts is None else facts
        if estimated and not summary.get("architecture"):
            why = "the header was not read and no architecture is known"
            return Verdict.refuse(backend, Refusal.MODEL, f"{candidate.name}: {why}")
        if estimated:
            # The repo's tokenizer is known when the description read another quant's header.
            header_problem = tokenizer_problem(summary) if summary.get("tokenizer_model") else None
        else:
            header_problem = _header_only_problem(summary, candidate)
        problem = model_problem(summary) or header_problem
        if problem is not None:
            return Verdict.refuse(backend, Refusal.MODEL, f"{candidate.name}: {problem}")
        return judge(GgufChoice(candidate, summary, estimated))

    return choose_gguf_candidate(backend, model, request, order, judge_candidate)


def _header_only_problem(summary: dict[str, Any], candidate: GGUFCandidate) -> str | None:
    """What only a read header shows: a shard its name does not call one, or a tokenizer the engine lacks."""
    split = summary.get("split")
    count = split.get("count") if isinstance(split, dict) else None
    if isinstance(count, int) and count > len(candidate.files):
        return f"the header says it is one shard of a split set of {count}, which its name does not say"
    return tokenizer_problem(summary)


def _no_candidate(candidates: Sequence[GGUFCandidate], readable: Iterable[str]) -> str:
    """Why no candidate is left: an incomplete set (naming a missing shard), projectors only, or quants."""
    incomplete = [c for c in candidates if c.missing]
    if incomplete:
        return f"{incomplete[0].name} is one shard of a split set that lacks {incomplete[0].missing[0]}"
    if not candidates:
        return "no language-model GGUF (only projectors)"
    quants = ", ".join(sorted({c.quant or "?" for c in candidates}))
    return f"no language-model GGUF at a quant the kernels read (the repo has {quants}; read: {', '.join(readable)})"


def tokenizer_problem(summary: dict[str, object]) -> str | None:
    """Why the shared tokenizer (byte-level BPE, or Gemma 4's) does not read this GGUF's vocabulary, or None."""
    from anyformer_gguf_gpu.tokenizer import PRE_TOKENIZERS, pre_tokenizer_name

    model, pre = summary.get("tokenizer_model"), pre_tokenizer_name(summary.get("tokenizer_pre"))
    if model == "gemma4":
        return None  # its own split; the pre-tokenizer name is not read
    if model != "gpt2":
        return f"tokenizer model {model!r} (only byte-level BPE, 'gpt2', and Gemma 4's 'gemma4' are read)"
    if pre not in PRE_TOKENIZERS:
        return f"pre-tokenizer {pre!r} is not one this engine splits like llama.cpp"
    return None


def load_caps(request: Request, *, gpu: bool) -> Caps:
    """The machine as a load sees it, for re-running ``can_run`` to take the file it chose: host memory
    free now, the request's budget (the core filled it from the probe), a writable store."""
    return Caps(gpu=gpu, gpu_bytes=request.budget or None, ram_bytes=host_ram_available(), store=True)


def fetch_chosen_gguf(model: Model, progress: ProgressCallback, backend: str, verdict: Verdict) -> tuple[str, Path]:
    """Fetch the file (or split set) ``verdict`` (``can_run`` again, at load) names and report ``verify``.

    A refusal is raised as ``NO_BACKEND`` with its reason. Returns the first file's name and local path.
    """
    if not verdict.ok or verdict.estimate is None:
        raise AnyformerError(ErrorCode.NO_BACKEND, f"{model.ref}: {verdict.reason}")
    names = list(verdict.estimate.files)
    paths = fetch_files(model, names, progress, backend=backend)
    progress(ProgressEvent(stage="verify", backend=backend, file=names[0]))
    return names[0], paths[names[0]]
