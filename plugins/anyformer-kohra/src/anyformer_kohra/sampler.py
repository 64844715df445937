"""The denoising loops of masked-diffusion LMs: MDLM over the whole answer, BD3LM block by block.

Both follow the MDLM reference sampler. The answer starts fully masked; over ``steps`` steps the
time ``t`` runs from 1 to ``eps`` on a linear grid (the log-linear noise schedule, under which the
chance a token is still masked at time ``t`` is ``t``). Two ways to unmask:

- ``ancestral`` (the reference's DDPM update): with the model's distribution ``p(x0)`` over tokens
  for each masked position, a masked token stays masked with weight ``s`` (the next time) and
  becomes token ``v`` with weight ``p(v) * (t - s)``, drawn with the Gumbel-max trick;
- ``confidence``: every masked position takes its most likely (or, above temperature 0, a sampled)
  token, and the positions the model is surest of are kept, as many as the linear schedule
  unmasks per step; the rest stay masked.

Unmasked tokens are carried over unchanged (MDLM's substitution parameterization), so a final
token never changes. ``ddpm_cache``: when a step changes no token and the graph takes no time
input, the next step's model output would be the same, so the call is skipped and the last output
reused. After the last step any position still masked takes its arg-max token (the reference's
noise-removal step), so nothing stays masked.

BD3LM denoises blocks of ``block_size`` tokens left to right with the same update; the denoiser
attends to the earlier blocks (cached) and the current one, and each finished block is committed
before the next starts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Protocol

import numpy as np

#: The schedule's last time (the reference's ``eps``): t never reaches 0, where sigma is infinite.
EPS = 1e-5
METHODS = ("ancestral", "confidence")
#: About how many float64 values one chunk of a step's sampling holds (8 MiB).
CHUNK_VALUES = 1 << 20


class Denoiser(Protocol):
    """The model as the sampler sees it: logits for the tokens being denoised."""

    #: True when the graph takes the noise level as an input (then no output can be reused).
    time_conditioned: bool

    @property
    def calls(self) -> int:
        """How many times the graph has run."""
        ...

    def logits(self, tokens: np.ndarray, sigma: float) -> np.ndarray:
        """Logits ``[len(tokens), vocab]`` for ``tokens`` (the answer, or the current block)."""
        ...


class BlockDenoiser(Denoiser, Protocol):
    """A denoiser that keeps finished blocks as context (BD3LM)."""

    def commit(self, tokens: np.ndarray) -> None:
        """Add a finished block to the context the next blocks attend to."""
        ...


@dataclasses.dataclass(frozen=True)
class SamplerSettings:
    """How to denoise: the mask id, the step count, the unmasking method, temperature, seed, cache."""

    mask_id: int
    steps: int
    method: str = "confidence"
    temperature: float = 0.0
    seed: int | None = None
    cache: bool = True
    #: BD3LM's block length; None for MDLM (one block: the whole answer).
    block_size: int | None = None


@dataclasses.dataclass(frozen=True)
class SamplerState:
    """The answer after one step: its ids (the mask id where masked), the block, and bookkeeping."""

    step: int
    ids: np.ndarray
    block: int
    #: The answer positions before this one are in finished blocks (BD3LM) or, for MDLM, 0 until the end.
    settled: int
    model_calls: int


def sigma_of(t: float) -> float:
    """The log-linear schedule's total noise at time ``t``: ``-log(1 - (1 - eps) t)``."""
    return -math.log1p(-(1.0 - EPS) * t)


def token_probs(logits: np.ndarray, mask_id: int, temperature: float) -> np.ndarray:
    """Softmax over the vocabulary in float64, the mask token excluded; temperature 0 counts as 1."""
    scaled = logits.astype(np.float64) / (temperature if temperature > 0 else 1.0)
    scaled[:, mask_id] = -np.inf
    scaled -= scaled.max(axis=-1, keepdims=True)
    probs = np.exp(scaled)
    probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def gumbel_argmax(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Draw one index per row with probability proportional to ``weights`` (the reference's Gumbel-max form)."""
    uniform = rng.random(weights.shape)
    return np.argmax(weights / (1e-10 - np.log(uniform + 1e-10)), axis=-1)


def _row_chunks(count: int, vocab: int) -> Iterator[slice]:
    """Row ranges holding about :data:`CHUNK_VALUES` values each, so a step's float64 work stays bounded."""
    rows = max(1, CHUNK_VALUES // max(1, vocab))
    for start in range(0, count, rows):
        yield slice(start, min(start + rows, count))


def ancestral_update(
    x: np.ndarray, logits: np.ndarray, t: float, s: float, settings: SamplerSettings, rng: np.random.Generator
) -> np.ndarray:
    """One DDPM step from time ``t`` to ``s``: each masked token stays masked or becomes a token."""
    masked = np.flatnonzero(x == settings.mask_id)
    if masked.size == 0:
        return x
    vocab = logits.shape[-1]
    out = x.copy()
    # Row by row in chunks: the draws come from the generator in the same order as one [masked, vocab]
    # draw would, but a 50k vocabulary never needs a [1024, 50k] float64 array at once.
    for rows in _row_chunks(masked.size, vocab):
        chunk = logits[masked[rows]]
        if settings.temperature > 0:
            p_x0 = token_probs(chunk, settings.mask_id, settings.temperature)
        else:
            p_x0 = np.zeros(chunk.shape)
            candidates = np.where(np.arange(vocab) == settings.mask_id, -np.inf, chunk)
            p_x0[np.arange(len(chunk)), np.argmax(candidates, axis=-1)] = 1.0
        weights = p_x0 * (t - s)
        weights[:, settings.mask_id] = s
        out[masked[rows]] = gumbel_argmax(weights, rng)
    return out


def confidence_update(
    x: np.ndarray, logits: np.ndarray, count: int, settings: SamplerSettings, rng: np.random.Generator
) -> np.ndarray:
    """Unmask the ``count`` masked positions the model is surest of (ties: the earlier position)."""
    masked = np.flatnonzero(x == settings.mask_id)
    if count <= 0 or masked.size == 0:
        return x
    picks = np.empty(masked.size, dtype=np.int64)
    confidence = np.empty(masked.size)
    for rows in _row_chunks(masked.size, logits.shape[-1]):
        probs = token_probs(logits[masked[rows]], settings.mask_id, settings.temperature)
        chosen = gumbel_argmax(probs, rng) if settings.temperature > 0 else np.argmax(probs, axis=-1)
        picks[rows] = chosen
        confidence[rows] = probs[np.arange(len(probs)), chosen]
    keep = np.argsort(-confidence, kind="stable")[:count]
    out = x.copy()
    out[masked[keep]] = picks[keep]
    return out


def fill_remaining(x: np.ndarray, logits: np.ndarray, mask_id: int) -> np.ndarray:
    """The noise-removal step: every still-masked position takes its arg-max token."""
    masked = np.flatnonzero(x == mask_id)
    out = x.copy()
    if masked.size:
        rows = logits[masked].astype(np.float64)
        rows[:, mask_id] = -np.inf
        out[masked] = np.argmax(rows, axis=-1)
    return out


def denoise_span(
    denoiser: Denoiser, length: int, steps: int, settings: SamplerSettings, rng: np.random.Generator
) -> Iterator[np.ndarray]:
    """Denoise ``length`` masked tokens in ``steps`` steps; yield the tokens after each step (and the fill)."""
    x = np.full(length, settings.mask_id, dtype=np.int64)
    grid = np.linspace(1.0, EPS, steps + 1)
    dt = (1.0 - EPS) / steps
    cached: np.ndarray | None = None
    for i in range(steps):
        if not np.any(x == settings.mask_id):
            # Nothing left to unmask: the remaining steps would copy every token.
            return
        t = float(grid[i])
        if cached is None:
            cached = denoiser.logits(x, sigma_of(t))
        if settings.method == "ancestral":
            x_next = ancestral_update(x, cached, t, t - dt, settings, rng)
        else:
            still_masked = int(np.count_nonzero(x == settings.mask_id))
            count = still_masked - length * (steps - 1 - i) // steps
            x_next = confidence_update(x, cached, count, settings, rng)
        # ddpm_cache: the same tokens give the same logits, unless the graph also sees the time.
        if not settings.cache or denoiser.time_conditioned or not np.array_equal(x_next, x):
            cached = None
        x = x_next
        yield x
    if np.any(x == settings.mask_id):
        logits = cached if cached is not None else denoiser.logits(x, sigma_of(EPS))
        yield fill_remaining(x, logits, settings.mask_id)


def sample_mdlm(denoiser: Denoiser, length: int, settings: SamplerSettings) -> Iterator[SamplerState]:
    """MDLM: the whole answer denoised at once; one state per step."""
    rng = np.random.default_rng(settings.seed)
    step = 0
    for x in denoise_span(denoiser, length, settings.steps, settings, rng):
        step += 1
        settled = length if not np.any(x == settings.mask_id) else 0
        yield SamplerState(step=step, ids=x, block=0, settled=settled, model_calls=denoiser.calls)


def block_steps(total_steps: int, length: int, block_size: int) -> int:
    """Steps per block, so the whole answer takes about ``total_steps`` (at least one per block)."""
    blocks = math.ceil(length / block_size)
    return max(1, math.ceil(total_steps / blocks))


def sample_blocks(denoiser: BlockDenoiser, length: int, settings: SamplerSettings) -> Iterator[SamplerState]:
    """BD3LM: blocks left to right, each denoised while the earlier ones stay fixed; one state per step."""
    if settings.block_size is None:
        raise ValueError("sample_blocks needs settings.block_size")
    size = settings.block_size
    rng = np.random.default_rng(settings.seed)
    answer = np.full(length, settings.mask_id, dtype=np.int64)
    steps = block_steps(settings.steps, length, size)
    step = 0
    for block, start in enumerate(range(0, length, size)):
        if start:
            # Committed only when the next block starts, so a generation that stops early skips the call.
            denoiser.commit(answer[start - size : start])
        end = min(start + size, length)
        for x in denoise_span(denoiser, end - start, steps, settings, rng):
            step += 1
            answer = answer.copy()
            answer[start:end] = x
            settled = end if not np.any(x == settings.mask_id) else start
            yield SamplerState(step=step, ids=answer, block=block, settled=settled, model_calls=denoiser.calls)
