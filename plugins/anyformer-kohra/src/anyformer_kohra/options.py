"""kohra's own generate options, carried in ``GenerateOptions.extra`` and checked before any work.

- ``steps``: denoising steps for the whole answer (default ``max_new_tokens``: one token per step);
  BD3LM spreads them over its blocks, at least one per block.
- ``sampler``: ``"confidence"`` (the default at temperature 0: deterministic) or ``"ancestral"``
  (the MDLM reference's DDPM update; the default above temperature 0).
- ``block_size``: BD3LM's block length (default: config.json's ``block_size``, else 4).
- ``ddpm_cache``: reuse the model's output after a step that changed nothing (default True).
- ``on_step``: a callable given a :class:`~anyformer_kohra.steps.DiffusionStep` after every step
  (in-process only: a callable cannot cross into an isolated worker).

Sampling options (``top_p``, ``min_p``…) never get here: kohra's handle honours none, so the core refuses them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_kohra.sampler import METHODS
from anyformer_kohra.steps import DiffusionStep

#: The most steps one generation may take: each is a model call.
MAX_STEPS = 1_000_000
KNOWN = ("steps", "sampler", "block_size", "ddpm_cache", "on_step")


@dataclasses.dataclass(frozen=True)
class DiffusionOptions:
    """The checked kohra options of one generation."""

    steps: int
    method: str
    block_size: int | None
    cache: bool
    on_step: Callable[[DiffusionStep], object] | None


def _positive(value: Any, name: str, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{name} must be an integer in [1, {limit}], got {value!r}")
    return value


def parse_options(
    extra: Mapping[str, Any], *, max_new_tokens: int, temperature: float, default_block: int | None
) -> DiffusionOptions:
    """Check kohra's options; a malformed one is ``BAD_REQUEST``. Other names are left alone."""
    steps = _positive(extra.get("steps", max_new_tokens), "steps", MAX_STEPS)
    method = extra.get("sampler", "ancestral" if temperature > 0 else "confidence")
    if method not in METHODS:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"sampler must be one of {', '.join(METHODS)}, got {method!r}")
    block = extra.get("block_size", default_block)
    if default_block is None and "block_size" in extra:
        raise AnyformerError(ErrorCode.BAD_REQUEST, "block_size applies to block-diffusion models only")
    if block is not None:
        block = _positive(block, "block_size", 1 << 16)
    cache = extra.get("ddpm_cache", True)
    if not isinstance(cache, bool):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"ddpm_cache must be True or False, got {cache!r}")
    on_step = extra.get("on_step")
    if on_step is not None and not callable(on_step):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"on_step must be a callable, got {type(on_step).__name__}")
    return DiffusionOptions(steps=steps, method=str(method), block_size=block, cache=cache, on_step=on_step)
