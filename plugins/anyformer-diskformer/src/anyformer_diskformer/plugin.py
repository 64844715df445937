"""The anyformer hooks of the diskformer backend. Nothing heavy is imported here.

``can_run`` is :func:`~anyformer_diskformer.verdict.verdict_for` (which file, whether the engine reads
it, whether it fits); ``load`` opens :class:`~anyformer_diskformer.model.DiskformerModel`.
"""

from __future__ import annotations

from anyformer.plugin import (
    BackendModel,
    Caps,
    Model,
    ProgressCallback,
    Request,
    StoreEntry,
    Verdict,
    hookimpl,
)
from anyformer_diskformer.verdict import verdict_for


@hookimpl
def can_run(model: Model, caps: Caps, request: Request) -> Verdict:
    """Refuse with ``format``/``task``/``model``/``store``/``memory``, or estimate the host memory it holds."""
    return verdict_for(model, caps, request)


@hookimpl
def load(model: Model, request: Request, progress: ProgressCallback) -> BackendModel:
    """Fetch the GGUF, keep its dense tensors resident and open the expert cache."""
    from anyformer_diskformer.model import DiskformerModel

    return DiskformerModel.open(model, request, progress)


@hookimpl
def store_list() -> list[StoreEntry]:
    """Nothing: the GGUFs live in the Hugging Face cache (listed by the core); nothing is derived."""
    return []
