"""Which cached expert to evict: least recently used, frequency and recency together (LRFU), or the expert
least likely to be used at its layer's next turn (``reuse``, the default).

A policy sees every access (``touch``) and every eviction (``evicted``) and names the victim among
the keys the cache holds. Both the live :class:`~anyformer_diskformer.cache.expert_cache.ExpertCache`
and :func:`replay` over a recorded routing trace run the same policy objects.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Collection, Container
from typing import Protocol

import numpy as np

Key = tuple[int, int]


class EvictionPolicy(Protocol):
    """Chooses the expert to evict."""

    def touch(self, key: Key) -> None:
        """``key`` was used now (a hit, or a miss just inserted)."""

    def evicted(self, key: Key) -> None:
        """``key`` left the cache."""

    def victim(self, exclude: Container[Key] = ()) -> Key:
        """The held key to evict next, never one of ``exclude`` (keys in use now)."""

    def expect(self, keys: Collection[Key]) -> None:
        """The next layer's router predicts ``keys`` (the prefetcher's guess); a policy may keep them."""


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

    def expect(self, keys: Collection[Key]) -> None:
        """Predictions do not change LRU's order."""


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

    def expect(self, keys: Collection[Key]) -> None:
        """Predictions do not change LRFU's scores."""


class LayerReuse:
    """Evict the expert least likely to be used at its layer's next turn; among equals, the one needed last.

    A mixture-of-experts forward pass visits its layers in turn and asks each for its chosen experts once
    per visit, so an expert's chance of being used again is its layer's routing frequency, not how recently
    the cache saw it. Each expert's score counts its uses, each weighted by ``0.5 ** (visits since / half_life)``
    where visits are *its layer's* turns: an expert chosen at every turn of its layer scores the same whatever
    the layer, and one that stopped being chosen fades in ``half_life`` turns. Scores survive eviction.

    This is admission control as well as eviction: an expert just read scores its history plus one, and
    when no resident scores lower it is the next victim itself, so an expert unlikely to be reused never
    displaces one that is likely to be. Among equal scores the victim is the one whose layer comes next
    farthest ahead (the layer just computed first, the next layer last), as Belady's optimal policy would
    choose, then the least recent. Experts the next layer's router predicts (:meth:`expect`) are evicted
    only when nothing else is left: they are the ones needed soonest. A new turn of a layer starts when
    another layer is touched, or when an expert already used in this turn is touched again (a one-layer
    model).
    """

    def __init__(self, n_layer: int, half_life: float = 2.0) -> None:
        if n_layer < 1:
            raise ValueError("n_layer must be at least 1")
        if not half_life > 0:
            raise ValueError("half_life must be positive")
        self._n_layer = n_layer
        self._decay = 0.5 ** (1.0 / half_life)
        self._visits = np.zeros(n_layer, dtype=np.int64)
        self._layer = -1
        self._this_turn: set[Key] = set()
        self._now = 0
        # Per expert ever seen, at the row ``_row[key]`` of parallel arrays: its score at turn ``_stamp`` of its
        # layer, its layer, its last use, whether it is held. Arrays, so that a victim is chosen by a few vector
        # operations over the held experts: ranking them one by one in Python cost the H200's 25 % cache (1334
        # slots) ~0.4 s a token of 48 layers, more than the products.
        self._row: dict[Key, int] = {}
        self._keys: list[Key] = []
        self._value = np.zeros(64, dtype=np.float64)
        self._stamp = np.zeros(64, dtype=np.int64)
        self._layer_of = np.zeros(64, dtype=np.int64)
        self._last = np.zeros(64, dtype=np.int64)
        self._held = np.zeros(64, dtype=bool)
        self._expected: frozenset[Key] = frozenset()

    def _row_of(self, key: Key) -> int:
        row = self._row.get(key)
        if row is None:
            row = len(self._keys)
            if row == self._value.size:
                grow = 2 * row
                self._value = np.resize(self._value, grow)
                self._stamp = np.resize(self._stamp, grow)
                self._layer_of = np.resize(self._layer_of, grow)
                self._last = np.resize(self._last, grow)
                self._held = np.concatenate([self._held, np.zeros(row, dtype=bool)])
            self._row[key] = row
            self._keys.append(key)
            self._value[row] = 0.0
            self._stamp[row] = 0
            self._layer_of[row] = key[0]
        return row

    def _score(self, key: Key) -> float:
        row = self._row.get(key)
        if row is None:
            return 0.0
        return float(self._value[row] * self._decay ** int(self._visits[key[0]] - self._stamp[row]))

    def touch(self, key: Key) -> None:
        """Count one use of ``key`` in its layer's current turn (starting a new turn where this is one)."""
        layer = key[0]
        if not 0 <= layer < self._n_layer:
            raise ValueError(f"layer {layer} of a {self._n_layer}-layer model")
        if layer != self._layer or key in self._this_turn:
            self._visits[layer] += 1
            self._layer = layer
            self._this_turn.clear()
        self._this_turn.add(key)
        score = self._score(key) + 1.0
        row = self._row_of(key)
        self._value[row] = score
        self._stamp[row] = self._visits[layer]
        self._now += 1
        self._last[row] = self._now
        self._held[row] = True

    def evicted(self, key: Key) -> None:
        """``key`` is no longer held (its score is kept)."""
        row = self._row.get(key)
        if row is not None:
            self._held[row] = False

    def victim(self, exclude: Container[Key] = ()) -> Key:
        """The held key not in ``exclude`` with the lowest score, then the farthest layer ahead, then least recent."""
        rows = np.flatnonzero(self._held[: len(self._keys)])
        if isinstance(exclude, (set, frozenset, dict)):
            skip = [self._row[k] for k in exclude if k in self._row]
            if skip:
                rows = rows[~np.isin(rows, skip)]
        else:
            rows = rows[[self._keys[r] not in exclude for r in rows]]
        if rows.size == 0:
            raise ValueError("no held expert may be evicted")
        # The next layer's predicted experts go only when nothing else is left: they are needed soonest.
        if self._expected:
            unexpected = rows[[self._keys[r] not in self._expected for r in rows]]
            rows = unexpected if unexpected.size else rows
        # The same float64 arithmetic as _score (a power of the decay by each layer's turns since the stamp), so the
        # order, ties included, is the one a key-by-key ranking gives.
        scores = self._value[rows] * self._decay ** (self._visits[self._layer_of[rows]] - self._stamp[rows]).astype(
            np.float64
        )
        rows = rows[scores == scores.min()]
        # Layers ahead of the current one, 0 for the next layer up to n - 1 for the current one: the farthest first.
        ahead = (self._layer_of[rows] - self._layer - 1) % self._n_layer
        rows = rows[ahead == ahead.max()]
        return self._keys[int(rows[np.argmin(self._last[rows])])]

    def expect(self, keys: Collection[Key]) -> None:
        """Keep ``keys`` (the next layer's predicted experts) until the next prediction replaces them."""
        self._expected = frozenset(keys)


#: The names ``make_policy`` (and the ``cache_policy`` load option) take.
POLICY_NAMES = ("reuse", "lrfu", "lru")


def make_policy(name: str, n_layer: int) -> EvictionPolicy:
    """The policy a load option names for a model of ``n_layer`` layers: ``reuse``, ``lrfu`` or ``lru``;
    another name is a ``ValueError``."""
    if name == "lru":
        return LRU()
    if name == "lrfu":
        return LRFU()
    if name == "reuse":
        return LayerReuse(n_layer)
    raise ValueError(f"cache policy {name!r}; the policies are {', '.join(POLICY_NAMES)}")


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
