"""Where one LocalMind decode step's time goes: GPU time by kernel kind, the dispatch floor, host encode, read-back lag.

Measured on the adapter wgpu picks, over a GGUF (``--model``) or random weights in SmolLM2-135M's shapes:
- GPU time of a whole step: ``--reps`` copies of the step's dispatches in one submission, then one wait;
- the same steps as separate submissions with one wait at the end (what the GPU sustains when never waited on);
- GPU time of each kernel kind alone (its dispatches of one step, repeated), and of as many dispatches as a
  step has of the cheapest kind (the per-dispatch floor: launch plus the barrier between dispatches);
- host time to encode one step as the engine does (its submissions waited for every 8 steps), and through
  wgpu-py's public API without submitting it;
- the greedy loop at several read-back lags and decode steps per submission, with the time spent encoding,
  submitting and waiting for read-backs.

Kernels repeated out of order write garbage into the KV cache and residual; only the timings matter here.
``--encode-only`` leaves out the GPU timings and runs the greedy loop at its defaults only: the host's
figures, which hardly depend on the GPU, on a software adapter (lavapipe) in reasonable time.

    python plugins/anyformer-localmind/bench/profile_step.py [--model PATH | --random-smollm2] [--reps 50]
        [--tokens 256] [--encode-only]
"""

from __future__ import annotations

import argparse
import collections
import os
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from bench_decode import SMOLLM2_SHAPES

from anyformer_gguf_gpu import decode
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.gpu import GPU
from anyformer_gguf_gpu.kernels import Dispatch
from anyformer_gguf_gpu.testing import write_random_gguf
from anyformer_gguf_gpu.transformer import TransformerEngine


def gpu_ms(engine: TransformerEngine, dispatches: Sequence[Dispatch], reps: int) -> float:
    """Milliseconds per repetition of ``dispatches``, all repetitions in one submission, waited for."""
    engine.read_id(0)  # nothing else in flight
    start = time.perf_counter()
    engine.kernels.run(list(dispatches) * reps)
    engine.read_id(0)
    return 1e3 * (time.perf_counter() - start) / reps


def profile(engine: TransformerEngine, reps: int) -> None:
    """Print the step's GPU time, its split by kernel kind and the dispatch floor."""
    step = engine.program(1, head=True, chained=True)  # a decode step: its input embedded by the step before
    gpu_ms(engine, step, 2)  # warm-up
    whole = min(gpu_ms(engine, step, reps) for _ in range(3))
    print(f"GPU time per step ({reps} steps in one submission): {whole:.3f} ms")
    engine.read_id(0)
    start = time.perf_counter()
    for _ in range(reps):
        engine.kernels.run(step)
    engine.read_id(0)
    print(f"{reps} separate submissions, one wait at the end: {1e3 * (time.perf_counter() - start) / reps:.3f} ms/step")
    kinds: dict[str, list[Dispatch]] = collections.defaultdict(list)
    for d in step:
        kinds[d.name].append(d)
    rows = sorted(
        ((min(gpu_ms(engine, ds, reps) for _ in range(2)), name, ds) for name, ds in kinds.items()),
        key=lambda row: -row[0],
    )
    for ms, name, ds in rows:
        print(f"  {name:12s} x{len(ds):3d}: {ms:.3f} ms/step ({1e3 * ms / len(ds):.1f} us each, groups {ds[0].groups})")
    print(f"  sum of kinds: {sum(row[0] for row in rows):.3f} ms")
    _, cheapest, ds = min(rows, key=lambda row: row[0] / len(row[2]))
    floor = gpu_ms(engine, [ds[0]] * len(step), reps)
    print(f"  {len(step)} x one '{cheapest}' dispatch: {floor:.3f} ms (per-dispatch floor)")
    encode_cost(engine, reps)


def encode_cost(engine: TransformerEngine, reps: int) -> None:
    """Print the host's time to encode one decode step: as the engine encodes it, and through wgpu-py's public API."""
    step = engine.program(1, head=True, chained=True)
    kernels = engine.kernels
    engine.read_id(0)
    kernels.encode_seconds = 0.0
    for i in range(reps):
        kernels.run(step)
        if i % 8 == 7:
            engine.read_id(0)  # a few submissions in flight at most, as in decoding
    engine.read_id(0)
    print(f"host encode of one step as the engine encodes it: {1e3 * kernels.encode_seconds / reps:.3f} ms")
    start = time.perf_counter()
    for _ in range(reps):
        encoder = engine.gpu.device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        for d in step:
            compute.set_pipeline(d.pipeline)
            compute.set_bind_group(0, d.bind_group)
            compute.dispatch_workgroups(*d.groups)
        compute.end()
        encoder.finish()
    public = 1e3 * (time.perf_counter() - start) / reps
    print(f"host encode of one step, wgpu-py's public API, not submitted: {public:.3f} ms")


def lag_sweep(
    engine: TransformerEngine, prompt: list[int], tokens: int, shapes: Sequence[tuple[int, int]] = ()
) -> None:
    """Run the greedy loop at several read-back lags and steps per submission, timing the read-back waits."""
    read = decode._Staging.read
    waited = [0.0]

    def timed_read(self: Any, buf: Any, promise: Any, dtype: Any) -> np.ndarray:
        start = time.perf_counter()
        try:
            return read(self, buf, promise, dtype)
        finally:
            waited[0] += time.perf_counter() - start

    decode._Staging.read = timed_read  # type: ignore[method-assign]
    kernels = engine.kernels
    try:
        for lag, steps in shapes or ((1, 1), (2, 1), (2, 2), (2, 4), (2, 8), (3, 4)):
            decode.LAG, decode.STEPS = lag, steps
            kernels.encode_seconds = kernels.submit_seconds = waited[0] = 0.0
            start = time.perf_counter()
            n = len(list(decode.greedy(engine, prompt, tokens)))
            seconds = time.perf_counter() - start
            print(
                f"lag {lag}, {steps} steps a submission: {n / seconds:.1f} tok/s, "
                f"{1e3 * seconds / n:.3f} ms/token: encode "
                f"{1e3 * kernels.encode_seconds / n:.3f}, submit {1e3 * kernels.submit_seconds / n:.3f}, "
                f"read-back wait {1e3 * waited[0] / n:.3f}"
            )
    finally:
        decode._Staging.read = read  # type: ignore[method-assign]
        decode.LAG, decode.STEPS = 2, 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a GGUF of an architecture LocalMind runs")
    parser.add_argument("--random-smollm2", action="store_true", help="random weights in SmolLM2's shapes (Q4_1)")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--encode-only", action="store_true", help="the host's figures only (for a CPU adapter)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model
        if args.random_smollm2 or not path:
            path = os.path.join(tmp, "smollm2-shapes-q4_1.gguf")
            write_random_gguf(path, SMOLLM2_SHAPES)
        gpu = GPU()
        print(f"adapter: {gpu.name}")
        with GGUFFile(path) as gguf:
            engine = TransformerEngine(gpu, gguf, ctx=args.tokens + 80, max_batch=64)
        vocab = engine.config.n_vocab
        prompt = [int(i) for i in np.random.default_rng(0).integers(0, min(vocab, 30000), size=64)]
        list(decode.greedy(engine, prompt, 8))  # warm-up; leaves the cache 72 positions deep
        print(f"dispatches per step: {engine.dispatches_per_token}")
        if args.encode_only:
            encode_cost(engine, args.reps)
            lag_sweep(engine, prompt[:8], args.tokens, [(decode.LAG, decode.STEPS)])
        else:
            profile(engine, args.reps)
            lag_sweep(engine, prompt[:8], args.tokens)
        engine.release()


if __name__ == "__main__":
    main()
