"""Model calls per generated token, with and without ddpm_cache, and tok/s against an autoregressive decode.

One run, one machine, the same model size throughout: a random DiT (``--hidden``, ``--layers``) is
exported to ONNX twice, as an MDLM graph (bidirectional, no time input, so the cache applies) and as
a graph with a key/value cache, which runs BD3LM's blocks and, fed one token at a time, is an
autoregressive decoder of the same size. Every figure is measured on kohra's own sampler and graph
runner (the streaming layer adds the same small cost to each), after one warm-up run.

    python plugins/anyformer-kohra/bench/bench_kohra.py [--tokens 64] [--hidden 256] [--layers 4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import tiny_diffusion
from kohra_fixtures import MASK_ID, READABLE, VOCAB

from anyformer_kohra.denoiser import (
    CachedBlockDenoiser,
    FullSequenceDenoiser,
    GraphRunner,
    inspect_graph,
)
from anyformer_kohra.ort_session import open_session
from anyformer_kohra.sampler import SamplerSettings, sample_blocks, sample_mdlm

PROMPT = np.array([257, 72, 105, 33, 258, 10, 257, 97, 10], dtype=np.int64)


def _graph(folder: Path, name: str, config: tiny_diffusion.TinyConfig) -> GraphRunner:
    path = folder / f"{name}.onnx"
    tiny_diffusion.export_onnx(tiny_diffusion.TinyDiffusionLM(config), str(path))
    session, _ = open_session(path)
    return GraphRunner(session, inspect_graph(session, {}))


def _timed(run: Callable[[], int], repeats: int) -> tuple[float, int]:
    """Best wall time of ``repeats`` runs after a warm-up, and the model calls of one run."""
    run()
    best, calls = float("inf"), 0
    for _ in range(repeats):
        start = time.perf_counter()
        calls = run()
        best = min(best, time.perf_counter() - start)
    return best, calls


def _autoregressive(runner: GraphRunner, tokens: int) -> int:
    before = runner.calls
    logits, cache = runner.run(PROMPT, 0.0, None)
    for _ in range(tokens):
        row = logits[-1].copy()
        row[MASK_ID] = -np.inf
        token = np.array([int(np.argmax(row))])
        logits, cache = runner.run(token, 0.0, cache)
    return runner.calls - before


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--block", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n = args.tokens
    shape = {"hidden": args.hidden, "layers": args.layers, "heads": max(1, args.hidden // 64), "readable": READABLE}
    with tempfile.TemporaryDirectory() as tmp:
        mdlm = _graph(Path(tmp), "mdlm", tiny_diffusion.TinyConfig(VOCAB, seed=1, **shape))  # type: ignore[arg-type]
        kv = _graph(Path(tmp), "kv", tiny_diffusion.TinyConfig(VOCAB, kv_cache=True, seed=1, **shape))  # type: ignore[arg-type]

        rows: list[tuple[str, float, int]] = []
        for steps in (n, 4 * n):
            for method in ("ancestral", "confidence"):
                for cache in (False, True):
                    settings = SamplerSettings(MASK_ID, steps, method, temperature=1.0, seed=0, cache=cache)

                    def run(settings: SamplerSettings = settings) -> int:
                        return list(sample_mdlm(FullSequenceDenoiser(mdlm, PROMPT), n, settings))[-1].model_calls

                    seconds, calls = _timed(run, args.repeats)
                    rows.append((f"MDLM {method:10} steps={steps:4} cache={'on ' if cache else 'off'}", seconds, calls))
        for cache in (False, True):
            settings = SamplerSettings(MASK_ID, n, "ancestral", 1.0, 0, cache=cache, block_size=args.block)

            def run_blocks(settings: SamplerSettings = settings) -> int:
                return list(sample_blocks(CachedBlockDenoiser(kv, PROMPT), n, settings))[-1].model_calls

            seconds, calls = _timed(run_blocks, args.repeats)
            rows.append(
                (f"BD3LM block={args.block} ancestral steps={n} cache={'on ' if cache else 'off'}", seconds, calls)
            )
        ar_seconds, ar_calls = _timed(lambda: _autoregressive(kv, n), args.repeats)
        rows.append(("autoregressive decode, key/value cache", ar_seconds, ar_calls))

    print(f"{n} tokens, hidden {args.hidden}, {args.layers} layers, vocab {VOCAB}, prompt {len(PROMPT)} tokens")
    print(f"{'run':58} {'calls':>6} {'calls/tok':>9} {'tok/s':>9} {'vs AR':>7}")
    ar_rate = n / ar_seconds
    for name, seconds, calls in rows:
        rate = n / seconds
        print(f"{name:58} {calls:6d} {calls / n:9.2f} {rate:9.1f} {rate / ar_rate:7.2f}x")


if __name__ == "__main__":
    main()
