"""The next token from one row of logits, in torch: greedy, or a seeded draw after temperature, top-k and top-p.

Greedy is ``argmax`` (ties to the lowest id, as ``model.generate`` picks them). A draw uses its own
``torch.Generator`` seeded from ``GenerateOptions.seed``, so the same seed gives the same text
whatever else runs in the process. Under a constraint (structured output) the core's
:class:`anyformer.plugin.TokenMask` sets every token that would leave the language to -inf after the
repetition penalty (on the CPU row as numpy, shared with torch without a copy), and advances past
the token chosen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from anyformer.plugin import AnyformerError, ErrorCode, GenerateOptions, TokenMask


def _number(extra: Mapping[str, Any], key: str, default: float, *, low: float, high: float) -> float:
    value = extra.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= high:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{key} must be a number in ({low:g}, {high:g}], got {value!r:.40}")
    return float(value)


@dataclasses.dataclass
class Sampler:
    """One generation's choice of tokens."""

    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    seed: int | None
    #: The constraint's mask (None: no constraint).
    mask: TokenMask | None = None

    @classmethod
    def for_options(
        cls, options: GenerateOptions, defaults: Mapping[str, Any], mask: TokenMask | None = None
    ) -> Sampler:
        """The sampler ``options`` ask for, with generation_config.json's ``defaults`` where they are silent."""
        top_k = options.extra.get("top_k", defaults.get("top_k", 0))
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"top_k must be an integer ≥ 0, got {top_k!r:.40}")
        top_p = _number(options.extra, "top_p", float(defaults.get("top_p", 1.0) or 1.0), low=0.0, high=1.0)
        penalty = _number(
            options.extra,
            "repetition_penalty",
            float(defaults.get("repetition_penalty", 1.0) or 1.0),
            low=0.0,
            high=100.0,
        )
        return cls(options.temperature, top_k, top_p, penalty, options.seed, mask)

    def __post_init__(self) -> None:
        import torch

        self._generator: Any = None
        if self.temperature > 0:
            self._generator = torch.Generator()
            if self.seed is not None:
                self._generator.manual_seed(self.seed)
            else:
                self._generator.seed()

    @property
    def finished(self) -> bool:
        """True when the constraint's value is complete: only the end may follow."""
        return self.mask is not None and self.mask.finished

    def choose(self, logits: Any, seen: Any) -> int:
        """The next token id from ``logits`` (1-D), ``seen`` the ids so far (1-D, for the repetition penalty);
        the constraint, if any, advances past it."""
        token = self._choose(logits, seen)
        if self.mask is not None:
            self.mask.consume(token)
        return token

    def _choose(self, logits: Any, seen: Any) -> int:
        import torch

        logits = logits.float()
        if self.repetition_penalty != 1.0 and seen.numel():
            # transformers' rule: each seen token once, a positive logit divided, a negative one multiplied.
            picked = logits.gather(0, seen)
            logits = logits.scatter(
                0, seen, torch.where(picked > 0, picked / self.repetition_penalty, picked * self.repetition_penalty)
            )
        if self.mask is not None:
            logits = torch.from_numpy(self.mask.masked(logits.cpu().numpy()))
        if self._generator is None:
            return int(torch.argmax(logits))
        scaled = logits / self.temperature
        if 0 < self.top_k < scaled.shape[0]:
            kth = torch.topk(scaled, self.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if self.top_p < 1.0:
            ordered, order = torch.sort(scaled, descending=True)
            cumulative = torch.softmax(ordered, dim=0).cumsum(dim=0)
            drop = cumulative - torch.softmax(ordered, dim=0) >= self.top_p  # keep the token that crosses top_p
            scaled = scaled.scatter(0, order, ordered.masked_fill(drop, float("-inf")))
        weights = torch.softmax(scaled, dim=0)
        return int(torch.multinomial(weights, 1, generator=self._generator))
