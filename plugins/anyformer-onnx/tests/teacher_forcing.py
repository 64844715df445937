"""Shared pieces of the chat tests: teacher forcing, the fixtures' recorded replies and their messages, refusals.

Teacher forcing: the decode loop runs torch's reply token by token, each step's logits kept. A test compares every
step's logits with torch's on torch's own path, so one early near-tie cannot hide the steps after it (greedy
replies are compared separately).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_onnx.chat.sampling import Sampler


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


def step_logits(loop: Any, reply: dict[str, Any], ids: list[int] | None = None, embeds: Any = None) -> list[np.ndarray]:
    """Every step's logits as ``loop`` runs torch's reply after the prompt (``ids``, else the reply's ``prompt_ids``;
    ``embeds``: the prompt's embeddings, media rows spliced in), stopping at id 2 as the fixtures' replies do."""
    teacher = Teacher(reply["reply_ids"])
    prompt = reply["prompt_ids"] if ids is None else ids
    tokens = loop.tokens(prompt, teacher, limit=len(reply["reply_ids"]), stop_ids=frozenset({2}), prompt_embeds=embeds)
    assert list(tokens) == reply["reply_ids"]
    return teacher.logits


def largest_gap(got: list[np.ndarray], want: list[list[float]]) -> float:
    """The largest difference between any step's logits and torch's (a test that shows a comparison can fail)."""
    return max(float(np.abs(g - np.asarray(w)).max()) for g, w in zip(got, want, strict=True))


def media_messages(folder: Path, reply: dict[str, Any]) -> list[dict[str, Any]]:
    """A recorded question as one user message: its images (paths), then its clips (samples), then its text."""
    blocks: list[dict[str, Any]] = [{"type": "image", "image": str(folder / name)} for name in reply["images"]]
    blocks += [{"type": "audio", "audio": np.load(folder / name)} for name in reply.get("clips", [])]
    return [{"role": "user", "content": [*blocks, {"type": "text", "text": reply["question"]}]}]


def refusal(loaded: Any, content: Any) -> AnyformerError:
    """The ``BAD_REQUEST`` a user message with ``content`` (text, or blocks) gets from ``loaded.generate``."""
    with pytest.raises(AnyformerError) as caught:
        list(loaded.generate([{"role": "user", "content": content}], max_new_tokens=2, temperature=0))
    assert caught.value.code == ErrorCode.BAD_REQUEST
    return caught.value
