"""What an isolated worker costs per token: ``load(isolate=True)`` against in-process, same model.

Both are loaded once in this process on the embedded SmolLM2-135M (or ``--model``) with the
llama.cpp backend, and generate the same greedy reply, interleaved round by round (in-process,
worker, in-process, …) so that machine noise hits both alike. Each round times the decode only:
from the first chunk to the last, divided by the tokens after the first. Reported: the median
time per token of each, and the ratio worker / in-process (and of the fastest rounds, which a busy
machine disturbs least). Target: ≤ 1.05. On an oversubscribed machine llama.cpp's spinning threads
make every figure noise; ``ANYFORMER_LLAMACPP_THREADS=1`` steadies them.

    python anyformer-core/bench/bench_isolation.py [--rounds 7] [--tokens 128] [--model PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import anyformer

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def _round(loaded: anyformer.Loaded, tokens: int) -> tuple[float, int]:
    """Seconds per token of one decode, and the tokens it made."""
    first_at = None
    first_tokens = 0
    last = anyformer.Chunk()
    for chunk in loaded.generate(PROMPT, max_new_tokens=tokens):
        if first_at is None and chunk.tokens:
            first_at, first_tokens = time.perf_counter(), chunk.tokens
        last = chunk
    end = time.perf_counter()
    made = last.tokens - first_tokens
    if first_at is None or made < 1:
        raise SystemExit(f"the model stopped after {last.tokens} tokens; pick a prompt that runs longer")
    return (end - first_at) / made, last.tokens


def main() -> None:
    """Print each round, the medians and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()
    model = args.model or anyformer.default_model_path()
    in_process = anyformer.load(model, backend="llamacpp")
    isolated = anyformer.load(model, backend="llamacpp", isolate=True)
    times: dict[str, list[float]] = {"in-process": [], "worker": []}
    try:
        for loaded in (in_process, isolated):  # warm up: first-call caches, the worker's imports
            _round(loaded, 16)
        for index in range(args.rounds):
            for name, loaded in (("in-process", in_process), ("worker", isolated)):
                per_token, made = _round(loaded, args.tokens)
                times[name].append(per_token)
                print(f"round {index + 1} {name:10} {per_token * 1e3:7.3f} ms/token ({made} tokens)")
    finally:
        in_process.dispose()
        isolated.dispose()
    local = statistics.median(times["in-process"])
    worker = statistics.median(times["worker"])
    print(f"in-process {local * 1e3:.3f} ms/token ({1 / local:.1f} tok/s)")
    print(f"worker     {worker * 1e3:.3f} ms/token ({1 / worker:.1f} tok/s)")
    print(f"ratio worker / in-process: {worker / local:.3f} (cost {100 * (worker / local - 1):+.1f} %; target ≤ +5 %)")
    best = min(times["worker"]) / min(times["in-process"])
    print(f"ratio of the fastest rounds (less sensitive to a busy machine): {best:.3f}")


if __name__ == "__main__":
    main()
