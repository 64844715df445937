"""Choosing the next token from logits: greedy, or a seeded draw with top-k and top-p, after penalties.

Under a constraint (structured output) the core's :class:`anyformer.plugin.TokenMask` sets every
token that would leave the language to -inf first, and advances past the token chosen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from anyformer.plugin import TokenMask


def apply_repetition_penalty(logits: np.ndarray, seen: Iterable[int], penalty: float) -> None:
    """Penalise every token already in the sequence, in place, as transformers does.

    A positive logit is divided by ``penalty`` and a negative one multiplied by it (CTRL's rule);
    each seen token counts once however often it appeared. ``penalty`` 1 changes nothing.
    """
    if penalty == 1.0:
        return
    ids = np.fromiter(set(seen), dtype=np.int64)
    if ids.size == 0:
        return
    ids = ids[(ids >= 0) & (ids < logits.shape[0])]
    values = logits[ids]
    logits[ids] = np.where(values > 0, values / penalty, values * penalty)


@dataclasses.dataclass
class Sampler:
    """Greedy at temperature 0 (arg-max, lowest id on ties); otherwise a draw from a seeded generator.

    ``mask`` (a constraint's, or None) limits the choice to the tokens its language allows next.
    """

    temperature: float
    top_k: int
    top_p: float
    seed: int | None
    mask: TokenMask | None = None

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed) if self.temperature > 0 else None

    @property
    def finished(self) -> bool:
        """True when the constraint's value is complete: only the end may follow."""
        return self.mask is not None and self.mask.finished

    def choose(self, logits: np.ndarray) -> int:
        """The next token id from one row of logits (advancing the constraint past it)."""
        if self.mask is None:
            return self._choose(logits)
        token = self._choose(self.mask.masked(logits))
        self.mask.consume(token)
        return token

    def _choose(self, logits: np.ndarray) -> int:
        if self._rng is None:
            return int(np.argmax(logits))  # numpy's argmax returns the first maximum: ties go to the lowest id
        scaled = logits.astype(np.float64) / self.temperature
        k = scaled.shape[0] if self.top_k <= 0 else min(self.top_k, scaled.shape[0])
        candidates = np.argpartition(scaled, -k)[-k:]
        # Sort by value, then id, so the draw depends only on the logits and the seed.
        order = np.lexsort((candidates, -scaled[candidates]))
        candidates = candidates[order]
        values = scaled[candidates]
        weights = np.exp(values - values[0])
        weights /= weights.sum()
        if self.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(weights), self.top_p) + 1)
            weights = weights[:keep] / weights[:keep].sum()
            candidates = candidates[:keep]
        return int(candidates[self._rng.choice(candidates.shape[0], p=weights)])
