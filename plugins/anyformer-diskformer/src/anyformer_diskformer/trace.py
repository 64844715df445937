"""Routing traces: which (layer, expert) the engine asked the cache for, in order, and their replay.

With ``ANYFORMER_DISKFORMER_TRACE=path`` set at load, every forward step appends one JSON line
``{"accesses": [[layer, expert], ...]}`` to ``path``. Replaying a trace under a policy at a number
of expert slots (the byte budget over one expert's bytes: every expert of a model has the same
size) gives that policy's hits, so a cache policy is compared with Belady's optimal one (evict the
expert whose next use is farthest away) on the same routing.
"""

from __future__ import annotations

import collections
import heapq
import json
import os
from typing import TextIO

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode

#: The environment variable naming the trace file.
TRACE_ENV = "ANYFORMER_DISKFORMER_TRACE"

Access = tuple[int, int]


class TraceWriter:
    """Appends one JSON line of accesses per forward step to a trace file."""

    def __init__(self, path: str) -> None:
        try:
            self._file: TextIO | None = open(path, "a", encoding="utf-8")
        except OSError as exc:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{TRACE_ENV}: cannot write {path}: {exc}", cause=exc) from exc

    def write(self, accesses: list[Access]) -> None:
        """Record one step's accesses (nothing once closed)."""
        if self._file is not None:
            self._file.write(json.dumps({"accesses": [list(a) for a in accesses]}) + "\n")
            self._file.flush()

    def close(self) -> None:
        """Close the file; safe to call twice."""
        file, self._file = self._file, None
        if file is not None:
            file.close()


def trace_writer_from_env() -> TraceWriter | None:
    """A writer for the file ``ANYFORMER_DISKFORMER_TRACE`` names, or None when it is unset or empty."""
    path = os.environ.get(TRACE_ENV)
    return TraceWriter(path) if path else None


def read_trace(path: str) -> list[Access]:
    """Every access of a trace file in order; a line that is not a step of [layer, expert] pairs is BAD_REQUEST."""
    accesses: list[Access] = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            try:
                step = json.loads(line)["accesses"]
                accesses.extend((int(layer), int(expert)) for layer, expert in step)
            except (ValueError, KeyError, TypeError) as exc:
                raise AnyformerError(ErrorCode.BAD_REQUEST, f"{path}:{number} is not a trace step") from exc
    return accesses


def replay_lru(accesses: list[Access], slots: int) -> int:
    """Hits of a least-recently-used cache of ``slots`` experts over ``accesses``."""
    cache: collections.OrderedDict[Access, None] = collections.OrderedDict()
    hits = 0
    for key in accesses:
        if key in cache:
            hits += 1
            cache.move_to_end(key)
            continue
        if len(cache) >= slots:
            cache.popitem(last=False)
        cache[key] = None
    return hits


def replay_belady(accesses: list[Access], slots: int) -> int:
    """Hits of Belady's optimal cache of ``slots`` experts: on a miss, evict the one used again farthest ahead."""
    never = len(accesses)
    next_use = [never] * len(accesses)
    seen: dict[Access, int] = {}
    for i in range(len(accesses) - 1, -1, -1):
        next_use[i] = seen.get(accesses[i], never)
        seen[accesses[i]] = i
    cache: dict[Access, int] = {}  # key -> its next use
    heap: list[tuple[int, Access]] = []  # (-next use, key); stale entries are skipped
    hits = 0
    for i, key in enumerate(accesses):
        if key in cache:
            hits += 1
        elif len(cache) >= slots:
            while True:
                far, victim = heapq.heappop(heap)
                if cache.get(victim) == -far:
                    del cache[victim]
                    break
        cache[key] = next_use[i]
        heapq.heappush(heap, (-next_use[i], key))
    return hits


def skewed_trace(
    n_layer: int,
    n_expert: int,
    top_k: int,
    tokens: int,
    *,
    zipf: float = 1.0,
    stay: float = 0.5,
    seed: int = 0,
) -> list[Access]:
    """A synthetic routing trace with the skew trained routers show, one decode token a step.

    Each layer has its own popularity order of the experts (a random permutation), the r-th most
    popular chosen with weight ``1 / r ** zipf``; each of a token's ``top_k`` choices at a layer is,
    with probability ``stay``, one of the experts the previous token chose there (temporal locality:
    consecutive tokens share experts), else drawn by popularity; a token's experts at a layer are
    distinct and asked for in ascending order, as the CPU engine asks. Deterministic for a ``seed``.
    """
    if not 0 < top_k <= n_expert:
        raise ValueError("top_k must be between 1 and the number of experts")
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, n_expert + 1, dtype=np.float64) ** zipf
    orders = [rng.permutation(n_expert) for _ in range(n_layer)]
    previous: list[list[int]] = [[] for _ in range(n_layer)]
    accesses: list[Access] = []
    for _ in range(tokens):
        for layer in range(n_layer):
            weights = np.zeros(n_expert)
            weights[orders[layer]] = popularity
            chosen: list[int] = []
            for _ in range(top_k):
                again = [e for e in previous[layer] if e not in chosen]
                if again and rng.random() < stay:
                    expert = int(again[int(rng.integers(len(again)))])
                else:
                    expert = int(rng.choice(n_expert, p=weights / weights.sum()))
                chosen.append(expert)
                weights[expert] = 0.0
            previous[layer] = chosen
            accesses.extend((layer, e) for e in sorted(chosen))
    return accesses
