"""Teacher forcing for the chat tests: the decode loop runs torch's reply token by token, each step's logits kept.

A test compares every step's logits with torch's on torch's own path, so one early near-tie cannot hide the steps
after it (greedy replies are compared separately).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from anyformer_onnx.sampling import Sampler


class Teacher(Sampler):
    """Records each step's logits and answers with the next of ``tokens`` (torch's reply)."""

    def __init__(self, tokens: list[int]) -> None:
        super().__init__(0.0, 0, 1.0, None)
        self.tokens = iter(tokens)
        self.logits: list[np.ndarray] = []

    def choose(self, logits: np.ndarray) -> int:
        self.logits.append(logits.copy())
        return next(self.tokens)


def replies(folder: Path) -> list[dict[str, Any]]:
    """The fixture's recorded replies (``reference.json``'s ``replies``)."""
    data: dict[str, Any] = json.loads((folder / "reference.json").read_text(encoding="utf-8"))
    return list(data["replies"])
