"""The request that comes with a model: the task, the accelerator budget, preferences."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from anyformer.contract._endpoints import parse_endpoints
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._sizes import parse_size


@dataclasses.dataclass(frozen=True)
class Request:
    """What the caller asks for besides the model.

    ``budget`` is the accelerator memory allowed, in bytes (None: what the probe found);
    ``prefer`` lists backend ids tried first; ``context`` is the context length in tokens a
    text model is loaded with (None: the backend's default); ``options`` passes backend-specific
    settings through unchanged; ``rpc`` names llama.cpp RPC servers (``host:port``) whose memory the
    load may span (docs/rpc.md): only a backend that says so in its estimate (``details["rpc"]``)
    runs such a request.
    """

    task: str | None = None
    budget: int | None = None
    prefer: tuple[str, ...] = ()
    context: int | None = None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    rpc: tuple[str, ...] = ()

    @classmethod
    def build(
        cls,
        *,
        task: str | None = None,
        budget: int | str | None = None,
        prefer: Sequence[str] | str | None = None,
        context: int | None = None,
        options: dict[str, Any] | None = None,
        rpc: str | Sequence[str] | None = None,
    ) -> Request:
        """Validate and normalise a request from user input; bad values raise ``BAD_REQUEST``."""
        if task is not None and (not isinstance(task, str) or not task.strip()):
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"task must be a non-empty string, got {task!r}")
        budget_bytes = None if budget is None else parse_size(budget)
        if isinstance(prefer, str):
            prefer = [p for p in prefer.split(",") if p.strip()]
        if context is not None and (isinstance(context, bool) or not isinstance(context, int) or context <= 0):
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"context must be a positive number of tokens, got {context!r}")
        return cls(
            task=task.strip() if task else None,
            budget=budget_bytes,
            prefer=tuple(p.strip() for p in (prefer or ())),
            context=context,
            options=dict(options or {}),
            rpc=parse_endpoints(rpc),
        )

    def budget_or(self, default: int | None) -> int:
        """The budget in bytes, or ``default`` (what the probe found) when none was given."""
        if self.budget is not None:
            return self.budget
        return default or 0
