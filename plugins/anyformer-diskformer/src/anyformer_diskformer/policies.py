"""Which cached expert to evict: least recently used, or frequency and recency together (LRFU).

A policy sees every access (``touch``) and every eviction (``evicted``) and names the victim among
the keys the cache holds. Both the live :class:`~anyformer_diskformer.expert_cache.ExpertCache`
and :func:`replay` over a recorded routing trace run the same policy objects.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Container
from typing import Protocol

Key = tuple[int, int]


class EvictionPolicy(Protocol):
    """Chooses the expert to evict."""

    def touch(self, key: Key) -> None:
        """``key`` was used now (a hit, or a miss just inserted)."""

    def evicted(self, key: Key) -> None:
        """``key`` left the cache."""

    def victim(self, exclude: Container[Key] = ()) -> Key:
        """The held key to evict next, never one of ``exclude`` (keys in use now)."""


class LRU:
    """Evict the expert used least recently."""

    def __init__(self) -> None:
        self._order: collections.OrderedDict[Key, None] = collections.OrderedDict()

    def touch(self, key: Key) -> None:
        """Move ``key`` to the most recent end."""
        self._order[key] = None
        self._order.move_to_end(key)

    def evicted(self, key: Key) -> None:
        """Forget ``key``."""
        self._order.pop(key, None)

    def victim(self, exclude: Container[Key] = ()) -> Key:
        """The least recent held key not in ``exclude``."""
        return next(k for k in self._order if k not in exclude)


class LRFU:
    """Evict the expert with the smallest exponentially decayed use count (frequency and recency together).

    Each use adds 1 to an expert's score, and scores halve every ``half_life`` accesses, so an expert
    used often stays ahead of one used once a little later; ``half_life`` → 0 is LRU and → ∞ is LFU.
    Scores survive eviction: an expert that comes back keeps its history. Ties go to the least recent.
    """

    def __init__(self, half_life: float = 256.0) -> None:
        if not half_life > 0:
            raise ValueError("half_life must be positive")
        self._rate = math.log(2) / half_life
        self._now = 0
        # The score is kept as log-free "score at time 0": score(t) = stored * exp(-rate * t), so
        # comparisons need no per-key decay; rebased when it grows too large for a float.
        self._stored: dict[Key, float] = {}
        self._last: dict[Key, int] = {}
        self._held: set[Key] = set()

    def touch(self, key: Key) -> None:
        """Add one use of ``key`` now."""
        self._now += 1
        if self._rate * self._now > 600:
            self._rebase()
        self._stored[key] = self._stored.get(key, 0.0) + math.exp(self._rate * self._now)
        self._last[key] = self._now
        self._held.add(key)

    def _rebase(self) -> None:
        shift = math.exp(-self._rate * self._now)
        self._stored = {k: v * shift for k, v in self._stored.items()}
        self._now = 0
        self._last = {k: t - 10**12 for k, t in self._last.items()}  # keep the order, in the past

    def evicted(self, key: Key) -> None:
        """``key`` is no longer held (its score is kept)."""
        self._held.discard(key)

    def victim(self, exclude: Container[Key] = ()) -> Key:
        """The held key not in ``exclude`` with the smallest decayed score; the least recent among equals."""
        return min((k for k in self._held if k not in exclude), key=lambda k: (self._stored[k], self._last[k]))


def make_policy(name: str) -> EvictionPolicy:
    """The policy a load option names: ``lru`` or ``lrfu``; another name is a ``ValueError``."""
    if name == "lru":
        return LRU()
    if name == "lrfu":
        return LRFU()
    raise ValueError(f"cache policy {name!r}; the policies are lru and lrfu")


def replay(accesses: list[Key], slots: int, policy: EvictionPolicy) -> int:
    """Hits of a cache of ``slots`` experts under ``policy`` over ``accesses``."""
    held: set[Key] = set()
    hits = 0
    for key in accesses:
        if key in held:
            hits += 1
        else:
            if len(held) >= slots:
                victim = policy.victim()
                held.discard(victim)
                policy.evicted(victim)
            held.add(key)
        policy.touch(key)
    return hits
