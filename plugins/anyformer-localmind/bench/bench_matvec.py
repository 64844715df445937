"""GPU time of the decoding matrix kernel alone, by matrix shape and kernel variant.

Each (variant, shape) builds one dispatch of ``Kernels.matvec`` over random weights, queues ``--reps`` copies of
it in one submission, waits, and reports microseconds a dispatch and the weight bytes moved as GB/s (and as a
fraction of ``--peak-gbps``). A copy depends on nothing the one before wrote, but WebGPU still orders them
(a barrier between dispatches of one pass), so the figure is what a model's step pays for that product.

Variants: the current kernel at each ``--threads-per-row`` and ``--workgroup`` size (``kernels.WORKGROUP``, which
with the threads a row sets the rows a workgroup covers),
and with ``--source NAME=PATH`` another ``matvec.wgsl`` (e.g. an earlier commit's, from ``git show``) at the
same settings, so a change is measured against what it replaces in one process.

    python plugins/anyformer-localmind/bench/bench_matvec.py [--quant Q4_1] [--reps 200] [--workgroup 64 128]
        [--threads-per-row 32] [--source before=/tmp/matvec-before.wgsl] [--peak-gbps 4800]

On lavapipe set ANYFORMER_SOFTWARE_GPU=1 and use ``--reps 5 --threads-per-row 1`` (only the ranking means much).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from anyformer_gguf_gpu import kernels as kernels_module
from anyformer_gguf_gpu.gpu import GPU
from anyformer_gguf_gpu.kernels import Kernels
from anyformer_gguf_gpu.quants import FORMATS, QuantFormat
from anyformer_gguf_gpu.testing import random_blocks

#: The formats by name.
BY_NAME: dict[str, QuantFormat] = {f.name: f for f in FORMATS.values()}


@dataclasses.dataclass(frozen=True)
class Shape:
    """One product of a decode step: ``rows`` × ``cols`` weights, with the input normed or SwiGLU'd as the
    step has it."""

    name: str
    rows: int
    cols: int
    norm: bool = False
    swiglu: bool = False


#: The products of SmolLM2-135M's and Qwen3-0.6B's decode steps (the q/k/v stack, the output projection,
#: gate|up, down, the head).
SHAPES = (
    Shape("smollm2 qkv", 576 + 2 * 192, 576, norm=True),
    Shape("smollm2 o", 576, 576),
    Shape("smollm2 gate_up", 2 * 1536, 576, norm=True),
    Shape("smollm2 down", 576, 1536, swiglu=True),
    Shape("smollm2 head", 49152, 576, norm=True),
    Shape("qwen3-0.6b qkv", 2048 + 2 * 1024, 1024, norm=True),
    Shape("qwen3-0.6b o", 1024, 2048),
    Shape("qwen3-0.6b gate_up", 2 * 3072, 1024, norm=True),
    Shape("qwen3-0.6b down", 1024, 3072, swiglu=True),
    Shape("qwen3-0.6b head", 151936, 1024, norm=True),
    Shape("tiny (the floor)", 64, 256),
)


@contextmanager
def kernel_variant(workgroup: int, source: Path | None, tpr: int = 4, tokens_per_thread: int = 4) -> Iterator[None]:
    """Kernels built inside the block use ``workgroup`` threads a workgroup, ``tpr`` threads a row and
    ``tokens_per_thread`` tokens a thread in the several-token (tiled) variant and, if given, ``source`` as
    matvec.wgsl."""
    saved = (kernels_module.PREFILL_THREADS_PER_ROW, kernels_module.PREFILL_TOKENS_PER_THREAD)
    kernels_module.PREFILL_THREADS_PER_ROW, kernels_module.PREFILL_TOKENS_PER_THREAD = tpr, tokens_per_thread
    saved_workgroup, saved_wgsl = kernels_module.WORKGROUP, kernels_module._wgsl
    kernels_module.WORKGROUP = workgroup
    if source is not None:
        text = source.read_text(encoding="utf-8")
        kernels_module._wgsl = lambda name: text if name == "matvec.wgsl" else saved_wgsl(name)  # type: ignore[assignment]
    try:
        yield
    finally:
        kernels_module.WORKGROUP, kernels_module._wgsl = saved_workgroup, saved_wgsl  # type: ignore[assignment]
        kernels_module.PREFILL_THREADS_PER_ROW, kernels_module.PREFILL_TOKENS_PER_THREAD = saved


def time_dispatch(gpu: GPU, run: Callable[[int], None], reps: int) -> float:
    """Microseconds a dispatch: ``run(reps)`` queues ``reps`` copies in one submission; best of three."""
    run(2)  # compile, first use of the buffers
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        run(reps)
        best = min(best, time.perf_counter() - start)
    return 1e6 * best / reps


def bench(gpu: GPU, shape: Shape, quant: str, tpr: int, reps: int, rng: np.random.Generator, tokens: int = 1) -> float:
    """Microseconds a dispatch of ``shape`` over ``tokens`` tokens with the kernels the current variant compiles."""
    fmt = BY_NAME[quant]
    kernels = Kernels(gpu, threads_per_row=tpr if tokens == 1 else max(tpr, 4))
    weights = gpu.upload(random_blocks(fmt, shape.rows * shape.cols, rng))
    width = 2 * shape.cols if shape.swiglu else shape.cols
    x = gpu.upload(rng.standard_normal(tokens * width).astype(np.float32))
    y = gpu.buffer(tokens * shape.rows * 4)
    norm = gpu.upload(np.ones(shape.cols, dtype=np.float32)) if shape.norm else None
    dispatch = kernels.matvec(weights, fmt, shape.rows, shape.cols, x, y, tokens=tokens, swiglu=shape.swiglu, norm=norm)

    def run(n: int) -> None:
        kernels.run([dispatch] * n)
        gpu.read(y, np.float32, 1)  # waits for the submission

    return time_dispatch(gpu, run, reps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quant", default="Q4_1", choices=sorted(BY_NAME))
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--workgroup", type=int, nargs="+", default=[64])
    parser.add_argument("--threads-per-row", type=int, nargs="+", default=[32])
    parser.add_argument("--source", action="append", default=[], help="NAME=PATH of another matvec.wgsl")
    parser.add_argument("--peak-gbps", type=float, default=None)
    parser.add_argument("--only", default="", help="run only the shapes whose name contains this")
    parser.add_argument("--skip", default="", help="leave out the shapes whose name contains this")
    parser.add_argument("--tokens", type=int, default=1, help="tokens a product (more than 1: the tiled kernel)")
    parser.add_argument(
        "--tokens-per-thread", type=int, nargs="+", default=[4], help="the tiled kernel's tokens a thread"
    )
    args = parser.parse_args()
    gpu = GPU()
    print(f"adapter: {gpu.name}, quant {args.quant}, {args.reps} dispatches a submission")
    sources: list[tuple[str, Path | None]] = [("current", None)]
    sources += [(spec.split("=", 1)[0], Path(spec.split("=", 1)[1])) for spec in args.source]
    fmt = BY_NAME[args.quant]
    rng = np.random.default_rng(0)
    for shape in (s for s in SHAPES if args.only in s.name and not (args.skip and args.skip in s.name)):
        nbytes = fmt.row_bytes(shape.cols) * shape.rows
        per_thread = args.tokens_per_thread if args.tokens > 1 else [1]
        for name, source in sources:
            for workgroup in args.workgroup:
                for tpr in args.threads_per_row:
                    for tb in per_thread:
                        if tpr > workgroup:
                            continue
                        try:
                            with kernel_variant(workgroup, source, tpr, tb):
                                us = bench(gpu, shape, args.quant, tpr, args.reps, rng, args.tokens)
                        except Exception as exc:  # a variant the adapter cannot compile (workgroup memory)
                            print(f"{shape.name:20s} wg {workgroup:3d} tpr {tpr:2d} tb {tb:2d}: failed: {exc}")
                            continue
                        gbps = nbytes / us / 1e3
                        peak = f" ({gbps / args.peak_gbps:.1%} of peak)" if args.peak_gbps else ""
                        flops = 2 * shape.rows * shape.cols * args.tokens / us / 1e6
                        print(
                            f"{shape.name:20s} {shape.rows:6d}x{shape.cols:<5d} {name:8s} wg {workgroup:3d} "
                            f"tpr {tpr:2d} tb {tb:2d}: {us:8.2f} us  {gbps:7.1f} GB/s{peak}  {flops:7.1f} TFLOP/s",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
