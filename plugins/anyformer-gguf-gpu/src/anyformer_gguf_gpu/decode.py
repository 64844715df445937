"""The decode loop: one queue submission per token, the sampled id kept on the GPU, read back late.

Greedy decoding never waits for the GPU inside a step: step ``p`` embeds ids[p] (which the
previous step's argmax wrote on the GPU) and writes ids[p+1]; the same submission copies ids[p]
into a small staging buffer, whose map is requested right after the submission (not when the id
is wanted): wgpu-native's poll waits for every submission made before it, so a map asked for
after step ``p+1`` was queued would also wait for ``p+1`` and leave the GPU idle while Python
encodes ``p+2``. Asked for early, the map of ``p`` resolves when ``p`` is done, and the host
encodes the next steps while the GPU runs the current ones. After the first token, a submission
covers ``STEPS`` decode steps (each its own compute pass) and one read-back of their ids. A stop
token is therefore seen a few steps after it was made; the extra steps only write past the reply in
the KV cache, which the next call overwrites.

Sampling at a temperature above 0 runs the same loop with the GPU sampler (top-k / top-p, a
uniform draw hashed from the seed and the position) in place of the argmax.

Under a constraint (structured output) the choice needs the host: :func:`constrained` reads each
step's logits back (n_vocab floats), masks them with the core's :class:`anyformer.plugin.TokenMask`
and chooses there, then writes the id and submits the next step. Each token therefore waits for
its step and its read-back (no submissions in flight, no several steps per submission): that, more
than the mask's own work, is what a constraint costs on this engine.
"""

from __future__ import annotations

import collections
import secrets
import threading
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import numpy as np

from anyformer.plugin import TokenMask

# Read at each reply as this module's globals: a test or a bench may set ``decode.STEPS`` for one run.
from anyformer_gguf_gpu.decode_pacing import LAG, STEPS

if TYPE_CHECKING:
    from anyformer_gguf_gpu.transformer import TransformerEngine


class _Staging:
    """A ring of small host-mappable buffers for ids read back late (the engine's, made at load)."""

    def __init__(self, engine: TransformerEngine, slots: int, nbytes: int) -> None:
        self.engine = engine
        self.nbytes = nbytes
        self.slots = engine.readback(slots, nbytes)
        self.next = 0

    def take(self) -> Any:
        buf = self.slots[self.next]
        self.next = (self.next + 1) % len(self.slots)
        return buf

    def request(self, buf: Any) -> Any:
        """Ask for ``buf`` to be mapped once the GPU has written it (call right after the submission)."""
        import wgpu  # type: ignore[import-untyped]

        from anyformer_gguf_gpu.gpu import gpu_errors

        with gpu_errors("reading a token back"):
            return buf.map_async(wgpu.MapMode.READ, 0, self.nbytes)

    def read(self, buf: Any, promise: Any, dtype: Any) -> np.ndarray:
        """Wait for the map ``request`` returned, copy the data out and unmap ``buf``."""
        from anyformer_gguf_gpu.gpu import gpu_errors

        with gpu_errors("reading a token back"):
            promise.sync_wait()
            try:
                data = np.frombuffer(buf.read_mapped(0, self.nbytes), dtype=dtype).copy()
            finally:
                buf.unmap()
        return data

    def settle(self, buf: Any, promise: Any) -> None:
        """Wait for a map nobody will read (an abandoned loop) and unmap, so no callback outlives the buffer."""
        try:
            promise.sync_wait()
            buf.unmap()
        except Exception:  # the loop is being left; a failed map changes nothing
            return


def greedy(
    engine: TransformerEngine, prompt: list[int], max_new: int, *, cancel: threading.Event | None = None
) -> Generator[int, None, None]:
    """Yield up to ``max_new`` greedy ids after ``prompt``; the caller stops early by closing the iterator."""
    engine.set_sampling(0.0)
    return _decode(engine, prompt, max_new, cancel)


def sampled(
    engine: TransformerEngine,
    prompt: list[int],
    max_new: int,
    *,
    temperature: float,
    seed: int | None,
    top_k: int = 40,
    top_p: float = 0.95,
    cancel: threading.Event | None = None,
) -> Generator[int, None, None]:
    """Yield up to ``max_new`` ids drawn on the GPU at ``temperature`` (top-k capped at 64, top-p), seeded."""
    engine.set_sampling(temperature, top_k=top_k, top_p=top_p, seed=secrets.randbits(32) if seed is None else seed)
    return _decode(engine, prompt, max_new, cancel)


def constrained(
    engine: TransformerEngine,
    prompt: list[int],
    max_new: int,
    mask: TokenMask,
    *,
    temperature: float = 0.0,
    seed: int | None = None,
    top_k: int = 40,
    top_p: float = 0.95,
    cancel: threading.Event | None = None,
) -> Generator[int, None, None]:
    """Yield up to ``max_new`` ids chosen on the host from masked logits (greedy, or a seeded top-k / top-p
    draw at ``temperature``); ``mask`` advances past each id yielded. One step, one read-back per token."""
    n = len(prompt)
    max_new = min(max_new, engine.ctx - n)
    if max_new <= 0:
        return
    rng = np.random.default_rng(seed) if temperature > 0 else None
    engine.prefill(prompt)  # its sampled ids[n] is overwritten below: the host chooses
    for step in range(max_new):
        logits = mask.masked(engine.read_logits(1)[0])
        token = int(logits.argmax()) if rng is None else host_draw(logits, temperature, top_k, top_p, rng)
        mask.consume(token)
        yield token
        if step + 1 == max_new or (cancel is not None and cancel.is_set()):
            return
        engine.set_ids([token], n + step)
        engine.submit_step(n + step, 1, head=True, sample=False)


def host_draw(logits: np.ndarray, temperature: float, top_k: int, top_p: float, rng: np.random.Generator) -> int:
    """One id drawn at ``temperature`` among the ``top_k`` likeliest (0: all) within mass ``top_p``; tokens at
    -inf (masked) have no weight."""
    order = np.argsort(-logits, kind="stable")
    if top_k > 0:
        order = order[:top_k]
    z = logits[order].astype(np.float64) / temperature
    weights = np.exp(z - z[0])
    weights /= weights.sum()
    keep = min(len(weights), int(np.searchsorted(np.cumsum(weights), top_p) + 1))
    weights = weights[:keep] / weights[:keep].sum()
    return int(order[rng.choice(keep, p=weights)])


def _decode(
    engine: TransformerEngine, prompt: list[int], max_new: int, cancel: threading.Event | None
) -> Generator[int, None, None]:
    """The loop both samplers share: prefill, then one submission per token, ids read back LAG steps late."""
    n = len(prompt)
    max_new = min(max_new, engine.ctx - n)
    if max_new <= 0:
        return
    engine.prefill(prompt)  # its last step writes ids[n]
    staging = _Staging(engine, LAG + 1, 4 * STEPS)
    pending: collections.deque[tuple[Any, Any, int]] = collections.deque()
    submitted = 0  # ids of the reply that submissions cover
    try:
        while pending or submitted < max_new:
            while submitted < max_new and len(pending) < LAG:
                # The first submission covers one token (the first id comes back soonest), later ones STEPS.
                count = min(1 if submitted == 0 else STEPS, max_new - submitted)
                q = n + submitted
                # ids[q] is there already; the steps at q.. write ids[q+1..], the last one the next
                # submission's first id, which the reply's last submission does not need.
                steps = count if submitted + count < max_new else count - 1
                buf = staging.take()
                copy = (engine.ids, 4 * q, buf, 0, 4 * count)
                if steps:
                    engine.submit_decode(q, steps, copies=[copy])
                else:
                    engine.kernels.run([], [copy])  # the last id: nothing more to compute
                pending.append((buf, staging.request(buf), count))
                submitted += count
            buf, promise, count = pending.popleft()
            for token in staging.read(buf, promise, np.uint32)[:count]:
                yield int(token)
                if cancel is not None and cancel.is_set():
                    return
    finally:
        while pending:
            staging.settle(*pending.popleft()[:2])
