"""One stream's choice of its next token, as llama.cpp's sampler chain makes it.

In order: ``logit_bias`` is added, the penalties look at the reply's last ``PENALTY_WINDOW`` tokens
(``repeat_penalty`` divides a positive logit and multiplies a negative one, ``frequency_penalty``
subtracts per occurrence, ``presence_penalty`` once), a constraint masks what would leave its
language (``constraint.py``); then greedy takes the argmax, or a temperature keeps the ``top_k``
likeliest (0: all), scales by the temperature, keeps the ``top_p`` mass and what is at least
``min_p`` times as likely as the likeliest, and draws from a numpy generator seeded by ``seed``.
The penalties count only the reply's tokens, not the prompt's, as OpenAI describes them.
"""

from __future__ import annotations

import collections
from concurrent.futures import Executor
from typing import Any

import numpy as np

from anyformer.plugin import PENALTY_WINDOW, AnyformerError, ErrorCode, GenerateOptions

#: Defaults for sampling when the temperature is above 0, as llama.cpp's own.
TOP_K = 40
TOP_P = 0.95
#: Temperatures below this pick the likeliest token (the limit of sampling as T -> 0): dividing the
#: logits by a subnormal such as 5e-324 overflows to infinity and the weights to NaN.
GREEDY_BELOW_TEMPERATURE = 1e-3

#: Every sampling option this sampler applies, and the features the engine adds (``LlamaCppModel.honours``).
HONOURED_SAMPLING = frozenset(
    {"top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "repeat_penalty", "logit_bias"}
)


class Sampler:
    """The token choice of one stream: its options, its random generator, its recent tokens, its constraint.

    ``mask`` is an :class:`anyformer.plugin.TokenMask` (or None): ``choose`` applies
    it and ``accept`` advances it; with ``ahead`` (an executor) ``accept`` then has the next mask
    computed there while the engine decodes the token. Logits given to ``choose`` are never written to.
    """

    def __init__(self, options: GenerateOptions, n_vocab: int, mask: Any = None, ahead: Executor | None = None) -> None:
        extra = options.extra
        self.temperature = options.temperature
        greedy = not options.temperature >= GREEDY_BELOW_TEMPERATURE  # NaN, -0.0 and subnormals too
        self.rng = None if greedy else np.random.default_rng(options.seed)
        top_k = int(extra.get("top_k", TOP_K))
        self.top_k = n_vocab if top_k == 0 else min(top_k, n_vocab)
        self.top_p = float(extra.get("top_p", TOP_P))
        self.min_p = float(extra.get("min_p", 0.0))
        self.repeat = float(extra.get("repeat_penalty", 1.0))
        self.frequency = float(extra.get("frequency_penalty", 0.0))
        self.presence = float(extra.get("presence_penalty", 0.0))
        bias: dict[int, float] = extra.get("logit_bias") or {}
        wrong = sorted(token for token in bias if token >= n_vocab)
        if wrong:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"logit_bias: token {wrong[0]} is not in the vocabulary of {n_vocab} tokens"
            )
        self._bias_ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        self._bias_values = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        self._penalised = self.repeat != 1.0 or self.frequency != 0.0 or self.presence != 0.0
        self._recent: collections.deque[int] = collections.deque(maxlen=PENALTY_WINDOW)
        self.mask = mask
        self._ahead = ahead

    @property
    def finished(self) -> bool:
        """True when the constraint accepts nothing more than the end: the reply is complete."""
        return self.mask is not None and self.mask.finished

    def choose(self, logits: np.ndarray) -> int:
        """The next token from ``logits`` (the last position's, unchanged)."""
        work = logits
        if len(self._bias_ids) or (self._penalised and self._recent):
            work = logits.astype(np.float32, copy=True)
            if len(self._bias_ids):
                work[self._bias_ids] += self._bias_values
            if self._penalised and self._recent:
                self._penalise(work)
        if self.mask is not None:
            work = self.mask.masked(work)  # the mask's own row: the logits are not copied twice
        if self.rng is None:
            return int(work.argmax())
        return self._draw(work)

    def accept(self, token: int) -> None:
        """Record the token the stream emitted: the penalties count it, the constraint advances past it."""
        self._recent.append(token)
        if self.mask is not None:
            self.mask.consume(token)
            if self._ahead is not None:
                self.mask.compute_ahead(self._ahead)

    def _penalise(self, work: np.ndarray) -> None:
        tokens, counts = np.unique(np.fromiter(self._recent, dtype=np.int64), return_counts=True)
        values = work[tokens]
        if self.repeat != 1.0:
            values = np.where(values > 0, values / self.repeat, values * self.repeat)
        values = values - counts * self.frequency - self.presence
        work[tokens] = values

    def _draw(self, work: np.ndarray) -> int:
        assert self.rng is not None
        k = self.top_k
        candidates = np.argpartition(work, -k)[-k:] if k < work.shape[0] else np.arange(work.shape[0])
        scaled = work[candidates].astype(np.float64) / self.temperature
        if not np.isfinite(scaled).all():  # logits the engine made infinite or NaN: no distribution to draw from
            return int(candidates[np.nanargmax(np.where(np.isnan(scaled), -np.inf, scaled))])
        if self.top_p >= 1.0 and self.min_p <= 0.0:
            weights = np.exp(scaled - scaled.max())  # nothing is cut: no need to sort the whole vocabulary
            return int(candidates[self.rng.choice(len(candidates), p=weights / weights.sum())])
        order = np.argsort(-scaled)
        candidates, scaled = candidates[order], scaled[order]
        weights = np.exp(scaled - scaled[0])
        weights /= weights.sum()
        keep = min(int(np.searchsorted(np.cumsum(weights), self.top_p) + 1), len(weights))
        if self.min_p > 0.0:
            keep = min(keep, int(np.count_nonzero(weights >= self.min_p * weights[0])))
        weights = weights[:keep] / weights[:keep].sum()
        return int(candidates[self.rng.choice(keep, p=weights)])
