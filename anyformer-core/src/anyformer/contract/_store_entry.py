"""One stored model, as ``anyformer ls`` lists it (docs/contract.md, "The store")."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class StoreEntry:
    """A model held on disk: which backend can run or derived it, its repo and revision, path and bytes."""

    backend: str
    repo: str
    revision: str | None
    path: str
    bytes: int
    #: ``ok``, or why the entry cannot be used as it is (``corrupted: …``).
    state: str = "ok"

    def to_dict(self) -> dict[str, Any]:
        """The entry as JSON-ready data."""
        return dataclasses.asdict(self)
