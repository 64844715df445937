"""A GGUF backend's choice among a repo's candidates: its order, tried until one fits (:func:`choose_gguf_candidate`).

The backend orders the candidates (its kernels' types, its quant preference) and judges one at a
time with its own ``can_run`` arithmetic; this module walks that order so that every backend
walks it the same way: the ``file`` option names the one to judge, a candidate that does not fit
the budget or host memory gives way to the next smaller one, any other refusal to the next in
order, and at most :data:`MAX_CANDIDATES_JUDGED` are judged (each may cost a header read).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from anyformer.contract._errors import AnyformerError
from anyformer.contract._model import Model
from anyformer.contract._request import Request
from anyformer.contract._verdict import Refusal, Verdict
from anyformer.files._gguf_candidates import GGUFCandidate, chosen_by_name
from anyformer.store._gguf_facts import gguf_facts

#: Candidates judged per ``can_run`` at most.
MAX_CANDIDATES_JUDGED = 3

#: A backend's judgement of one candidate, given its header summary (None: no header to be had).
Judge = Callable[[GGUFCandidate, "dict[str, Any] | None"], Verdict]


def choose_gguf_candidate(
    backend: str, model: Model, request: Request, order: Sequence[GGUFCandidate], judge: Judge
) -> Verdict:
    """The first ``ok`` verdict along ``order`` (see the module), else the most telling refusal.

    That refusal is the smallest ``need`` among budget and memory refusals (what would make any
    candidate fit), else the first candidate's. ``request.options["file"]`` skips the order (an
    unknown name is ``BAD_REQUEST`` listing the weight files). No candidate: a ``model`` refusal.
    """
    named = chosen_by_name(model, request.options.get("file"))
    if named is not None:
        return _judged(backend, model, named, judge)
    if not order:
        return Verdict.refuse(backend, Refusal.MODEL, "no language-model GGUF this engine reads")
    refusals: list[Verdict] = []
    tried: set[str] = set()
    candidate: GGUFCandidate | None = order[0]
    while candidate is not None and len(tried) < MAX_CANDIDATES_JUDGED:
        tried.add(candidate.name)
        verdict = _judged(backend, model, candidate, judge)
        if verdict.ok:
            return verdict
        refusals.append(verdict)
        candidate = _next(order, candidate, verdict, tried)
    sized = [v for v in refusals if v.need is not None]
    worst = min(sized, key=lambda v: v.need or 0) if sized else refusals[0]
    if len(refusals) > 1 and worst.need is not None:
        reason = f"{worst.reason} (the smallest of {len(refusals)} files tried)"
        return Verdict.refuse(backend, worst.code or Refusal.MODEL, reason, worst.need)
    return worst


def _judged(backend: str, model: Model, candidate: GGUFCandidate, judge: Judge) -> Verdict:
    try:
        facts = gguf_facts(model, candidate)
    except AnyformerError as exc:  # a hostile or unreadable header: this candidate is no model
        return Verdict.refuse(backend, Refusal.MODEL, exc.message)
    return judge(candidate, facts)


def _next(
    order: Sequence[GGUFCandidate], current: GGUFCandidate, verdict: Verdict, tried: set[str]
) -> GGUFCandidate | None:
    left = [c for c in order if c.name not in tried]
    if verdict.need is not None:
        smaller = [c for c in left if c.size < current.size]
        return max(smaller, key=lambda c: c.size) if smaller else None
    return left[0] if left else None
