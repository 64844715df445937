"""The selection policy (docs/contract.md, "Selection"): which backend runs a model, deterministically."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from anyformer._format import describe_verdict_line
from anyformer._known_backends import install_hint
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._verdict import Refusal, Verdict


@dataclasses.dataclass(frozen=True)
class Selection:
    """Every verdict in the order the policy considered them, and the chosen one (or None)."""

    verdicts: tuple[Verdict, ...]
    chosen: Verdict | None

    @property
    def chosen_backend(self) -> str | None:
        """The chosen backend's id, or None when nothing can run the model."""
        return self.chosen.backend if self.chosen else None


def _sort_key(verdict: Verdict, prefer: Sequence[str]) -> tuple[int, int, float, str]:
    preferred = prefer.index(verdict.backend) if verdict.backend in prefer else len(prefer)
    if not verdict.ok or verdict.estimate is None:
        return (preferred, 99, 0.0, verdict.backend)
    speed = verdict.estimate.tok_per_sec
    return (preferred, int(verdict.estimate.rank), -(speed if speed is not None else -1.0), verdict.backend)


def order_verdicts(verdicts: Sequence[Verdict], prefer: Sequence[str] = ()) -> tuple[Verdict, ...]:
    """Runnable verdicts first, in policy order (preference, rank, measured speed, id); refusals after."""
    runnable = sorted((v for v in verdicts if v.ok), key=lambda v: _sort_key(v, prefer))
    refused = sorted((v for v in verdicts if not v.ok), key=lambda v: _sort_key(v, prefer))
    return tuple(runnable + refused)


def select(verdicts: Sequence[Verdict], prefer: Sequence[str] = ()) -> Selection:
    """Order the verdicts and pick the first runnable one."""
    ordered = order_verdicts(verdicts, prefer)
    chosen = ordered[0] if ordered and ordered[0].ok else None
    return Selection(verdicts=ordered, chosen=chosen)


def raise_if_none(selection: Selection, model_ref: str, formats: Iterable[str] = ()) -> Verdict:
    """Return the chosen verdict, or raise ``NO_BACKEND`` / ``BUDGET_TOO_SMALL`` carrying every verdict.

    When no installed backend reads the model's ``formats`` (none answered, or every one refused
    with ``format``), the message names the distributions that do (``docs/backends/README.md``).
    """
    if selection.chosen is not None:
        return selection.chosen
    verdicts = list(selection.verdicts)
    hint = ""
    if all(v.code is Refusal.FORMAT for v in verdicts):
        installed = [v.backend for v in verdicts]
        known = install_hint(formats, installed)
        hint = f"; {known}" if known else "; no known backend package reads its formats (docs/backends/README.md)"
    if not verdicts:
        raise AnyformerError(
            ErrorCode.NO_BACKEND,
            f"no backend is installed to run {model_ref}{hint or '; pip install anyformer-llamacpp'} "
            "(see `anyformer plugins`)",
            verdicts=verdicts,
        )
    if all(v.code is Refusal.BUDGET for v in verdicts):
        need = min(v.need for v in verdicts if v.need is not None)
        raise AnyformerError(
            ErrorCode.BUDGET_TOO_SMALL,
            f"{model_ref} does not fit the budget: " + "; ".join(describe_verdict_line(v) for v in verdicts),
            need=need,
            verdicts=verdicts,
        )
    raise AnyformerError(
        ErrorCode.NO_BACKEND,
        f"no backend can run {model_ref}: " + "; ".join(describe_verdict_line(v) for v in verdicts) + hint,
        verdicts=verdicts,
    )
