"""A torch port of the MDLM / BD3LM reference samplers (ancestral DDPM update), for checking kohra's numpy loop.

Written from the published algorithm, in torch, against the torch model: the answer starts masked,
t runs over ``linspace(1, eps, steps + 1)``, the model sees sigma = -log(1 - (1 - eps) t) when it is
time-conditioned, the mask token's logit is set to -inf, ``p(x0) = softmax(logits / T)``, the update's
weights are ``p(x0) (t - s)`` for tokens and ``s`` for staying masked, drawn by Gumbel-max, and unmasked
tokens are copied. A last arg-max fills any position still masked. No output is ever reused (no
cache): kohra with and without its cache must both match this.

The only liberty, for comparability: the Gumbel noise is drawn from a numpy ``Generator`` seeded
like kohra's, for the masked rows only, in the same order (the unmasked rows' draws are discarded
by the reference anyway, so the distribution is the same).
"""

from __future__ import annotations

import math

import numpy as np
import torch

EPS = 1e-5


def _sigma(t: float) -> torch.Tensor:
    return torch.tensor([-math.log1p(-(1.0 - EPS) * t)], dtype=torch.float32)


def _ancestral(
    x: torch.Tensor, logits: torch.Tensor, t: float, s: float, mask_id: int, temperature: float, rng
) -> torch.Tensor:
    masked = torch.nonzero(x == mask_id).flatten()
    if masked.numel() == 0:
        return x
    rows = logits[masked].double()
    rows[:, mask_id] = -torch.inf
    p_x0 = torch.softmax(rows / temperature, dim=-1)
    q = p_x0 * (t - s)
    q[:, mask_id] = s
    uniform = torch.from_numpy(rng.random(tuple(q.shape)))
    pick = (q / (1e-10 - torch.log(uniform + 1e-10))).argmax(dim=-1)
    out = x.clone()
    out[masked] = pick
    return out


def _denoise(call, length: int, steps: int, mask_id: int, temperature: float, rng) -> torch.Tensor:
    x = torch.full((length,), mask_id, dtype=torch.int64)
    grid = np.linspace(1.0, EPS, steps + 1)
    dt = (1.0 - EPS) / steps
    for i in range(steps):
        t = float(grid[i])
        x = _ancestral(x, call(x, _sigma(t)), t, t - dt, mask_id, temperature, rng)
    if bool((x == mask_id).any()):
        logits = call(x, _sigma(EPS)).double()
        logits[:, mask_id] = -torch.inf
        x = torch.where(x == mask_id, logits.argmax(dim=-1), x)
    return x


@torch.no_grad()
def mdlm_sample(model, prompt: list[int], length: int, steps: int, mask_id: int, seed: int, temperature=1.0):
    """The whole answer at once; the model sees prompt + answer on every step."""
    rng = np.random.default_rng(seed)
    prefix = torch.tensor(prompt, dtype=torch.int64)
    timed = model.config.time_conditioning

    def call(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        logits, _ = model(torch.cat([prefix, x])[None], sigma if timed else None)
        return logits[0, len(prompt) :]

    return _denoise(call, length, steps, mask_id, temperature, rng).tolist()


@torch.no_grad()
def bd3lm_sample(
    model, prompt: list[int], length: int, steps_per_block: int, block: int, mask_id: int, seed: int, temperature=1.0
):
    """Blocks left to right; each attends to the cached prompt and finished blocks, and to itself."""
    rng = np.random.default_rng(seed)
    _, cache = model(torch.tensor([prompt]), None)
    answer: list[int] = []
    for start in range(0, length, block):
        size = min(block, length - start)

        def call(x: torch.Tensor, sigma: torch.Tensor, past=cache) -> torch.Tensor:  # type: ignore[no-untyped-def]
            return model(x[None], None, past)[0][0]

        x = _denoise(call, size, steps_per_block, mask_id, temperature, rng)
        answer += x.tolist()
        _, cache = model(x[None], None, cache)
    return answer


def block_causal_bias(prompt_length: int, block_lengths: list[int]) -> torch.Tensor:
    """The additive mask ``[1, 1, n, n]`` of BD3LM without a cache: the prompt, then blocks, none seeing a later one.

    Built here in torch from block ends, independently of kohra's numpy mask.
    """
    ends = [prompt_length]
    for length in block_lengths:
        ends.append(ends[-1] + length)
    n = ends[-1]
    bias = torch.full((n, n), -1e30)
    start = 0
    for end in ends:
        bias[start:end, :end] = 0.0  # a segment sees itself and everything before it
        start = end
    return bias[None, None]


@torch.no_grad()
def bd3lm_recompute_sample(
    model, prompt: list[int], length: int, steps_per_block: int, block: int, mask_id: int, seed: int, temperature=1.0
):
    """Blocks left to right without a cache: every call runs the prompt, finished blocks and current block."""
    rng = np.random.default_rng(seed)
    answer: list[int] = []
    for start in range(0, length, block):
        size = min(block, length - start)
        blocks = [min(block, length - s) for s in range(0, start, block)] + [size]
        context = torch.tensor(prompt + answer, dtype=torch.int64)
        bias = block_causal_bias(len(prompt), blocks)

        def call(x: torch.Tensor, sigma: torch.Tensor, context=context, bias=bias) -> torch.Tensor:  # type: ignore[no-untyped-def]
            return model(torch.cat([context, x])[None], None, None, bias)[0][0, len(context) :]

        answer += _denoise(call, size, steps_per_block, mask_id, temperature, rng).tolist()
    return answer
