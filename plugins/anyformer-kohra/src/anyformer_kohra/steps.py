"""What the ``on_step`` generate option receives: one intermediate state of the denoising."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DiffusionStep:
    """The answer after one denoising step.

    ``text`` is the whole answer so far with every still-masked position shown as the mask token's
    text (``[MASK]`` in most tokenizers), reasoning included; ``step`` counts steps from 1 across
    the whole generation (for BD3LM, across blocks); ``masked`` is how many positions are still
    masked, ``block`` the block being denoised (always 0 for MDLM) and ``model_calls`` how many
    times the graph has run so far in this generation.
    """

    text: str
    step: int
    masked: int
    block: int
    model_calls: int
