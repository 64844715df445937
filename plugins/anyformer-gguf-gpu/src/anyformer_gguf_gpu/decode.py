"""The decode loop: one queue submission per token, the sampled id kept on the GPU, read back late.

Greedy decoding never waits for the GPU inside a step: step ``p`` embeds ids[p] (which the
previous step's argmax wrote on the GPU) and writes ids[p+1]; the same submission copies ids[p]
into a small staging buffer. The host submits step ``p+1`` before it maps the staging buffer of
step ``p``, so the GPU always has the next token queued while Python reads one token late (and
encodes the one after). A stop token is therefore seen one step after it was made; the extra step
only writes past the reply in the KV cache, which the next call overwrites.

Sampling at a temperature above 0 reads the logits back each step and draws on the host from a
generator seeded with the caller's seed (top-k / top-p from ``extra``); it waits for the GPU per token.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Generator
from typing import Any

import numpy as np

from anyformer_gguf_gpu.transformer import TransformerEngine

#: Steps in flight before the host reads an id back (2: the GPU runs step p+1 while p's id is read).
LAG = 2


class _Staging:
    """A ring of small host-mappable buffers for ids read back late."""

    def __init__(self, engine: TransformerEngine, slots: int, nbytes: int) -> None:
        self.engine = engine
        self.nbytes = nbytes
        self.slots = [engine.gpu.staging(nbytes, label=f"readback{i}") for i in range(slots)]
        self.next = 0

    def take(self) -> Any:
        buf = self.slots[self.next]
        self.next = (self.next + 1) % len(self.slots)
        return buf

    def read(self, buf: Any, dtype: Any) -> np.ndarray:
        import wgpu  # type: ignore[import-untyped]

        from anyformer_gguf_gpu.gpu import gpu_errors

        with gpu_errors("reading a token back"):
            buf.map_sync(wgpu.MapMode.READ, 0, self.nbytes)
            try:
                data = np.frombuffer(buf.read_mapped(0, self.nbytes), dtype=dtype).copy()
            finally:
                buf.unmap()
        return data


def greedy(
    engine: TransformerEngine, prompt: list[int], max_new: int, *, cancel: threading.Event | None = None
) -> Generator[int, None, None]:
    """Yield up to ``max_new`` greedy ids after ``prompt``; the caller stops early by closing the iterator."""
    n = len(prompt)
    max_new = min(max_new, engine.ctx - n)
    if max_new <= 0:
        return
    engine.prefill(prompt)  # its last step writes ids[n]
    staging = _Staging(engine, LAG + 1, 4)
    pending: collections.deque[Any] = collections.deque()
    submitted = 0
    produced = 0
    while produced < max_new:
        while submitted < max_new and len(pending) < LAG:
            q = n + submitted
            buf = staging.take()
            copy = (engine.ids, 4 * q, buf, 0, 4)
            if q + 1 < engine.ctx and submitted + 1 < max_new:
                engine.submit_step(q, 1, head=True, copies=[copy])  # computes ids[q+1] too
            else:
                engine.kernels.run([], [copy])  # the last id: nothing more to compute
            pending.append(buf)
            submitted += 1
        token = int(staging.read(pending.popleft(), np.uint32)[0])
        produced += 1
        yield token
        if cancel is not None and cancel.is_set():
            return


def sample_from_logits(
    logits: np.ndarray, rng: np.random.Generator, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> int:
    """One id drawn from softmax(logits / temperature), restricted to the top-k and the top-p mass."""
    order = np.argsort(-logits, kind="stable")
    if top_k > 0:
        order = order[:top_k]
    scaled = logits[order].astype(np.float64) / temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), top_p) + 1)
        order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
    return int(order[rng.choice(len(order), p=probs)])


def sampled(
    engine: TransformerEngine,
    prompt: list[int],
    max_new: int,
    *,
    temperature: float,
    seed: int | None,
    top_k: int = 0,
    top_p: float = 1.0,
) -> Generator[int, None, None]:
    """Yield up to ``max_new`` ids drawn at ``temperature`` (host-side sampling from read-back logits)."""
    n = len(prompt)
    max_new = min(max_new, engine.ctx - n)
    if max_new <= 0:
        return
    rng = np.random.default_rng(seed)
    vocab = engine.config.n_vocab
    staging = _Staging(engine, 1, 4 * vocab)
    buf = staging.take()
    engine.set_ids(prompt)
    done = 0
    while done < n:  # the prompt, without sampling on the GPU
        size = min(engine.max_batch, n - done)
        last = done + size == n
        copies = [(engine.logits, 0, buf, 0, 4 * vocab)] if last else None
        engine.submit_step(done, size, head=last, sample=False, copies=copies)
        done += size
    pos = n
    for produced in range(max_new):
        token = sample_from_logits(staging.read(buf, np.float32), rng, temperature, top_k, top_p)
        yield token
        if produced + 1 == max_new or pos + 1 > engine.ctx - 1:
            return
        engine.set_ids([token], pos)
        engine.submit_step(pos, 1, head=True, sample=False, copies=[(engine.logits, 0, buf, 0, 4 * vocab)])
        pos += 1
