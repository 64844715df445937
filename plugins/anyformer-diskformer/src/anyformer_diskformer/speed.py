"""A cheap model of decode speed for ``can_run``'s ``tok_per_sec``: disk and memory timed once per file and process.

A token runs every layer's top-k experts. Of those lookups the cache holds a fraction that, with
routing taken as uniform (the cautious case: real routers favour some experts, which raises it),
is the cache's share of all experts; the rest are read from disk. On the CPU a token costs

    (layers × k + dense bytes / one expert's bytes) × (time to apply one expert on one thread)
    + layers × k × (1 − held share) × one expert's bytes / disk bandwidth

(the dense weights are held as stored and multiplied by the same kernels as the experts, so they
cost about what experts of the same bytes cost; the engine's threads and the overlap of reads with
compute are left out: the cautious case on a busy machine)

with the disk timed by reading up to :data:`DISK_SAMPLE` bytes of the file's experts (``O_DIRECT``
where allowed, else after dropping them from the page cache), memory by a numpy copy, and one
expert's compute by running the first expert of the file. The GPU engine is not modelled: ``can_run``
does not open the GPU, so its speed there is None, and the reason says so.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time

import numpy as np

from anyformer_diskformer.plan import Plan

#: Bytes of the file the disk timing reads (at most).
DISK_SAMPLE = 16 * 2**20
#: Bytes the memory timing copies.
MEMORY_SAMPLE = 32 * 2**20


@dataclasses.dataclass(frozen=True)
class Measured:
    """What one file's timing found: disk and memory bytes a second, one expert's CPU seconds."""

    disk_bytes_per_s: float
    memory_bytes_per_s: float
    expert_seconds: float


def _time_disk(path: str, start: int, length: int) -> float:
    """Bytes a second reading ``length`` bytes at ``start`` without the page cache's help."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    align = 4096
    first = start - start % align
    span = max(align, (length // align) * align)
    try:
        fd = os.open(path, flags | os.O_DIRECT)
        import mmap

        buffer = mmap.mmap(-1, span)
        began = time.perf_counter()
        got = os.preadv(fd, [buffer], first)
        took = time.perf_counter() - began
        os.close(fd)
        return got / took if took > 0 and got else 0.0
    except (AttributeError, OSError):
        fd = os.open(path, flags)
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, first, span, os.POSIX_FADV_DONTNEED)  # time the disk, not the page cache
            began = time.perf_counter()
            data = os.pread(fd, span, first)
            took = time.perf_counter() - began
        finally:
            os.close(fd)
        return len(data) / took if took > 0 and data else 0.0


def _time_memory() -> float:
    source = np.ones(MEMORY_SAMPLE // 4, dtype=np.float32)
    target = np.zeros_like(source)  # written once first: the timing is not of page faults
    np.copyto(target, source)
    began = time.perf_counter()
    np.copyto(target, source)
    took = time.perf_counter() - began
    return 2 * source.nbytes / took if took > 0 else 0.0  # read and written


@functools.lru_cache(maxsize=8)
def measure(path: str, size: int, mtime: float) -> Measured | None:
    """Time the disk (this file), memory and one expert's CPU work; None when the file has no experts to read.

    Cached per (path, size, mtime): a second ``can_run`` on the same file costs nothing.
    """
    from anyformer_diskformer.expert_reader import ExpertReader, expert_spans
    from anyformer_diskformer.quant_product import QuantProduct, expert_ffn
    from anyformer_gguf_gpu.gguf_file import GGUFFile
    from anyformer_gguf_gpu.quants import format_of

    with GGUFFile(path) as gguf:  # a split set's shards too: the experts may lie in any of them
        summary = gguf.header.summary()
        layers, experts = summary.get("block_count"), summary.get("expert_count")
        if not isinstance(layers, int) or not isinstance(experts, int) or layers < 1 or experts < 1:
            return None
        spans = expert_spans(gguf, layers, experts)
        paths = gguf.paths
    shard = min(spans.values(), key=lambda span: (span.shard, span.offset)).shard
    in_shard = [span for span in spans.values() if span.shard == shard]
    first = min(span.offset for span in in_shard)
    end = max(span.offset + span.stride * (experts - 1) + span.length for span in in_shard)
    disk = _time_disk(paths[shard], first, min(DISK_SAMPLE, end - first))
    reader = ExpertReader(paths, spans)
    try:
        e = reader.read(0, 0)
    finally:
        reader.close()
    embd = int(summary.get("embedding_length") or 1)
    fmt = format_of(e.types[0])
    n_ff = e.gate.nbytes // fmt.type_size * fmt.block_size // embd  # the gate slab is n_ff rows of embd
    x = np.ones((1, embd), dtype=np.float32)
    kernels = QuantProduct()
    seconds = 0.0
    for _ in range(2):  # the second run is timed: the first warms numpy's code paths and the scratch
        began = time.perf_counter()
        expert_ffn(kernels, e, x, embd, n_ff)
        seconds = time.perf_counter() - began
    return Measured(disk, _time_memory(), seconds)


def tok_per_sec(path: str | None, plan: Plan, cache_bytes: int, device: str) -> tuple[float | None, str]:
    """The modelled decode speed and how it was reached (or why there is none)."""
    if device != "cpu":
        return None, "not modelled on the GPU: can_run does not open the GPU to time it"
    if path is None or not os.path.isfile(path):
        return None, "no file on disk to time the disk with"
    if plan.estimated:
        return None, "the header's tensors were not read, so the expert sizes are guesses"
    stat = os.stat(path)
    try:
        found = measure(path, stat.st_size, stat.st_mtime)
    except Exception as exc:  # a file that cannot be timed still gets its verdict; the reason says why
        return None, f"timing the file failed ({type(exc).__name__})"
    if found is None or found.disk_bytes_per_s <= 0 or found.memory_bytes_per_s <= 0:
        return None, "the disk or memory timing gave nothing"
    held = min(1.0, cache_bytes / plan.expert_bytes_total) if plan.expert_bytes_total else 1.0
    lookups = plan.n_layer * plan.experts_per_token
    seconds = (lookups + plan.dense_bytes / max(1, plan.one_expert_bytes)) * found.expert_seconds + lookups * (
        1.0 - held
    ) * plan.one_expert_bytes / found.disk_bytes_per_s
    why = (
        f"CPU model: {lookups} expert uses a token at {found.expert_seconds * 1e3:.2f} ms each, "
        f"{(1 - held) * 100:.0f}% of them read at {found.disk_bytes_per_s / 1e6:.0f} MB/s (uniform routing), "
        f"dense weights at the experts' cost a byte"
    )
    return (1.0 / seconds if seconds > 0 else None), why
