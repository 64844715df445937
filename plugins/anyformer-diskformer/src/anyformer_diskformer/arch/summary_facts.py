"""Counts read from the core's header summary, which may lack a key or hold junk: 0 stands for unknown."""

from __future__ import annotations

from typing import Any


def fact(summary: dict[str, Any], key: str) -> int:
    """The summary's positive whole number under ``key``, else 0."""
    value = summary.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def widest(summary: dict[str, Any], key: str) -> int:
    """A count the summary gives for the model or per layer (Gemma 4's heads): the largest."""
    value = summary.get(key)
    if isinstance(value, list):
        return max((v for v in value if isinstance(v, int) and not isinstance(v, bool) and v > 0), default=0)
    return fact(summary, key)
