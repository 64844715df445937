"""A cheap model of decode speed for ``can_run``'s ``tok_per_sec``: this machine's disk, memory and kernels, timed once.

A token runs every layer's top-k experts. Of those lookups the cache holds a fraction that, with
routing taken as uniform (the cautious case: real routers favour some experts, which raises it),
is the cache's share of all experts; the rest are read from disk. On the CPU a token costs

    (layers × k + dense bytes / one expert's bytes) × (one expert's bytes / the kernels' bytes a second)
    + layers × k × (1 − held share) × one expert's bytes / disk bandwidth

(the dense weights are held as stored and multiplied by the same kernels as the experts, so they
cost about what experts of the same bytes cost; the engine's threads and the overlap of reads with
compute are left out: the cautious case on a busy machine).

``can_run`` reads no model file (the hooks' rule), so nothing here touches the model: the disk is
timed by reading :data:`DISK_SAMPLE` bytes of a file of anyformer's own under ``ANYFORMER_HOME``
(``O_DIRECT`` where allowed, else after dropping it from the page cache), memory by a numpy copy,
and the kernels by one Q8_0 product of synthetic blocks. The figures are kept in
``ANYFORMER_HOME/diskformer/speed.json`` for :data:`KEEP_SECONDS`, so a fresh process pays nothing.

On the GPU (:func:`gpu_tok_per_sec`) the same lookups run on the adapter's kernels, whose costs
anyformer-gguf-gpu times once in a child process and keeps (``adapter_speed``): a token costs, per
layer, one submission and the read-back of the router's logits (the host routes) and the dispatches
of attention and the experts; every weight byte at the adapter's product rate for its format; and
each missed expert read from disk and uploaded. The host's Python per layer is left out.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time

import numpy as np

from anyformer_diskformer.plan import Plan

#: Bytes of the file the disk timing reads (at most).
DISK_SAMPLE = 16 * 2**20
#: Bytes the memory timing copies.
MEMORY_SAMPLE = 32 * 2**20
#: The synthetic matrix the kernels are timed on: rows × columns of Q8_0 blocks (about 2.2 MB).
KERNEL_ROWS, KERNEL_COLS = 1024, 2048
#: How long timed figures are kept before they are timed again (a week).
KEEP_SECONDS = 7 * 24 * 3600


@dataclasses.dataclass(frozen=True)
class Measured:
    """What this machine's timing found: disk and memory bytes a second, the kernels' weight bytes a second."""

    disk_bytes_per_s: float
    memory_bytes_per_s: float
    kernel_bytes_per_s: float


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


def _time_kernels() -> float:
    """Weight bytes a second of one single-thread Q8_0 product (synthetic blocks: the values do not change the time)."""
    from anyformer_diskformer.compute.quant_product import QuantProduct
    from anyformer_gguf_gpu.quants import Q8_0

    blocks = KERNEL_ROWS * (KERNEL_COLS // Q8_0.block_size)
    raw = np.random.default_rng(0).integers(0, 128, size=blocks * Q8_0.type_size, dtype=np.uint8)
    raw.reshape(blocks, Q8_0.type_size)[:, 1] = 0x3C  # each block's f16 scale 1.0-ish: finite numbers
    x = np.ones((1, KERNEL_COLS), dtype=np.float32)
    kernels = QuantProduct()
    seconds = 0.0
    for _ in range(2):  # the second run is timed: the first warms the code paths and the scratch
        began = time.perf_counter()
        kernels.product(x, raw, Q8_0.ggml_type, KERNEL_ROWS, KERNEL_COLS)
        seconds = time.perf_counter() - began
    return raw.nbytes / seconds if seconds > 0 else 0.0


def _probe_file(folder: str) -> str:
    """A file of :data:`DISK_SAMPLE` bytes of anyformer's own to time the disk with (written once)."""
    path = os.path.join(folder, "disk-probe.bin")
    if not os.path.isfile(path) or os.path.getsize(path) != DISK_SAMPLE:
        os.makedirs(folder, exist_ok=True)
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "wb") as out:
            out.write(os.urandom(DISK_SAMPLE))
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)
    return path


@functools.lru_cache(maxsize=1)
def measure() -> Measured | None:
    """This machine's disk, memory and kernel speeds: kept ones when fresh, else timed now and kept.

    None when ``ANYFORMER_HOME`` is not writable (no file of our own to time the disk with).
    """
    from anyformer.plugin import anyformer_home

    folder = os.path.join(str(anyformer_home()), "diskformer")
    kept = os.path.join(folder, "speed.json")
    try:
        with open(kept, encoding="utf-8") as source:
            data = json.load(source)
        if time.time() - float(data["timed_at"]) < KEEP_SECONDS:
            return Measured(float(data["disk"]), float(data["memory"]), float(data["kernels"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not kept yet, or unreadable: time it again
    try:
        disk = _time_disk(_probe_file(folder), 0, DISK_SAMPLE)
    except OSError:
        return None
    found = Measured(disk, _time_memory(), _time_kernels())
    try:
        partial = f"{kept}.{os.getpid()}.tmp"
        with open(partial, "w", encoding="utf-8") as out:
            json.dump(
                {
                    "timed_at": time.time(),
                    "disk": found.disk_bytes_per_s,
                    "memory": found.memory_bytes_per_s,
                    "kernels": found.kernel_bytes_per_s,
                },
                out,
            )
        os.replace(partial, kept)
    except OSError:
        pass  # kept for this process only
    return found


def tok_per_sec(path: str | None, plan: Plan, cache_bytes: int, device: str) -> tuple[float | None, str]:
    """The modelled decode speed and how it was reached (or why there is none); ``path`` is only asked
    whether the model is on disk (a what-if about a repo gets no speed), never opened."""
    if device != "cpu":
        return None, "not the CPU engine: see gpu_tok_per_sec"
    if path is None or not os.path.isfile(path):
        return None, "no file on disk to model the speed of"
    if plan.estimated:
        return None, "the header's tensors were not read, so the expert sizes are guesses"
    try:
        found = measure()
    except Exception as exc:  # a machine that cannot be timed still gets its verdict; the reason says why
        return None, f"timing this machine failed ({type(exc).__name__})"
    if found is None:
        return None, "ANYFORMER_HOME is not writable: no file of anyformer's own to time the disk with"
    if min(found.disk_bytes_per_s, found.memory_bytes_per_s, found.kernel_bytes_per_s) <= 0:
        return None, "the disk, memory or kernel timing gave nothing"
    expert_seconds = plan.one_expert_bytes / found.kernel_bytes_per_s
    held = min(1.0, cache_bytes / plan.expert_bytes_total) if plan.expert_bytes_total else 1.0
    lookups = plan.n_layer * plan.experts_per_token
    seconds = (lookups + plan.dense_bytes / max(1, plan.one_expert_bytes)) * expert_seconds + lookups * (
        1.0 - held
    ) * plan.one_expert_bytes / found.disk_bytes_per_s
    why = (
        f"CPU model: {lookups} expert uses a token at {expert_seconds * 1e3:.2f} ms each, "
        f"{(1 - held) * 100:.0f}% of them read at {found.disk_bytes_per_s / 1e6:.0f} MB/s (uniform routing; "
        "this machine's disk under ANYFORMER_HOME), dense weights at the experts' cost a byte"
    )
    return (1.0 / seconds if seconds > 0 else None), why


#: Dispatches of a layer besides its experts' (norm-fused q/k/v, rope and store, attention, output, router).
GPU_LAYER_DISPATCHES = 5
#: Dispatches of one routed expert (gate, up, down).
GPU_EXPERT_DISPATCHES = 3


def gpu_tok_per_sec(
    path: str | None, plan: Plan, cache_bytes: int, summary: dict[str, object]
) -> tuple[float | None, str]:
    """The modelled decode speed of the wgpu engine and how it was reached (or why there is none)."""
    if path is None or not os.path.isfile(path):
        return None, "no file on disk to model the speed of"
    if plan.estimated:
        return None, "the header's tensors were not read, so the expert sizes are guesses"
    from anyformer_gguf_gpu.adapter_speed import adapter_speed
    from anyformer_gguf_gpu.decode_speed import formats_read, matrix_seconds

    try:
        adapter = adapter_speed(os.environ.get("ANYFORMER_SOFTWARE_GPU") == "1", formats_read(dict(summary)))
        found = measure()
    except Exception as exc:  # a machine that cannot be timed still gets its verdict; the reason says why
        return None, f"timing this machine failed ({type(exc).__name__}: {str(exc)[:120]})"
    if found is None or found.disk_bytes_per_s <= 0 or not adapter.bytes_per_s or adapter.upload_bytes_per_s <= 0:
        return None, "the disk or the adapter's timing gave nothing"
    by_type = summary.get("decode_bytes_by_type")
    weights = {str(k): int(v) for k, v in by_type.items() if isinstance(v, int)} if isinstance(by_type, dict) else {}
    total = sum(weights.values())
    # One rate for every byte, the formats weighted by their bytes (experts and dense weights share the formats).
    matrix_s = matrix_seconds(weights, adapter) if total else None
    seconds_a_byte = matrix_s / total if matrix_s is not None else 1.0 / min(adapter.bytes_per_s.values())
    held = min(1.0, cache_bytes / plan.expert_bytes_total) if plan.expert_bytes_total else 1.0
    lookups = plan.n_layer * plan.experts_per_token
    dispatches = plan.n_layer * GPU_LAYER_DISPATCHES + lookups * GPU_EXPERT_DISPATCHES + 2
    compute = (plan.dense_bytes + lookups * plan.one_expert_bytes) * seconds_a_byte
    fixed = plan.n_layer * adapter.roundtrip_s + dispatches * adapter.floor_s
    missed = lookups * (1.0 - held) * plan.one_expert_bytes
    misses = missed / found.disk_bytes_per_s + missed / adapter.upload_bytes_per_s
    seconds = compute + fixed + misses
    why = (
        f"GPU model ({adapter.adapter}): {plan.n_layer} read-backs and {dispatches} dispatches "
        f"{fixed * 1e3:.1f} ms, weights {compute * 1e3:.1f} ms, {(1 - held) * 100:.0f}% of {lookups} expert uses "
        f"read at {found.disk_bytes_per_s / 1e6:.0f} MB/s and uploaded {misses * 1e3:.1f} ms (uniform routing; "
        "the host's routing in Python left out)"
    )
    return (1.0 / seconds if seconds > 0 else None), why
