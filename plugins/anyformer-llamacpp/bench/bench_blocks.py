"""Do llama.cpp's logits depend on the batch a position was computed in, and what do small batches cost?

The facts behind ``anyformer_llamacpp.prompt_blocks``:
1. One prompt evaluated in different batch shapes (one batch; blocks of 32; cut at another point;
   token by token): the largest difference of the last logits from the one-batch evaluation, and
   whether a greedy reply of 32 tokens is the same. Then the same prompt in blocks of 32 twice, once
   after a cache that held something else and was cut back to a block boundary: must be identical.
2. The time to evaluate a ~1,000-token prompt in batches of 16, 32, 64, 128 and 512 positions.

    python plugins/anyformer-llamacpp/bench/bench_blocks.py [--model PATH] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import llama_cpp  # imported before numpy (see anyformer_llamacpp/engine.py)
import numpy as np

import anyformer

TEXT = (
    "The keeper climbed the tower at dusk, trimmed the wick, wound the clockwork that turned the lens, "
    "and wrote the weather in the log: wind, sea state, ships seen, and the hour the lamp was lit. "
)


def _llama(path: str, threads: int, context: int = 2048) -> Any:
    return llama_cpp.Llama(
        model_path=path,
        n_ctx=context,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=512,
        verbose=False,
    )


def _logits(llama: Any) -> np.ndarray:
    view = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama._ctx.ctx, -1), shape=(llama.n_vocab(),))
    return view.copy()


def _evaluate(llama: Any, tokens: list[int], cuts: list[int], start: int = 0) -> np.ndarray:
    """Evaluate ``tokens[start:]`` with batches ending at ``cuts`` (and at the end); the last logits."""
    llama.n_tokens = start
    edges = [c for c in cuts if start < c < len(tokens)] + [len(tokens)]
    position = start
    for edge in edges:
        llama.eval(tokens[position:edge])
        position = edge
    return _logits(llama)


def _greedy(llama: Any, n: int) -> list[int]:
    out = []
    for _ in range(n):
        token = int(_logits(llama).argmax())
        out.append(token)
        llama.eval([token])
    return out


def shapes(path: str, threads: int) -> None:
    """Part 1: logits by batch shape."""
    llama = _llama(path, threads)
    tokens = llama.tokenize((TEXT * 4).encode(), add_bos=True)
    n = len(tokens)
    layouts: dict[str, list[int]] = {
        "one batch": [],
        "blocks of 32": list(range(32, n, 32)),
        f"cut at {n // 3}": [n // 3],
        "token by token": list(range(1, n)),
    }
    base = _evaluate(llama, tokens, [])
    base_reply = _greedy(llama, 32)
    print(f"prompt of {n} tokens, threads {threads}")
    for name, cuts in layouts.items():
        logits = _evaluate(llama, tokens, cuts)
        reply = _greedy(llama, 32)
        diff = float(np.abs(logits - base).max())
        print(f"  {name:>16}: max |logit - one batch| = {diff:.3g}, same 32-token greedy reply: {reply == base_reply}")
    blocks = list(range(32, n, 32))
    fresh = _evaluate(llama, tokens, blocks)
    other = llama.tokenize(("Something else entirely. " * 30).encode(), add_bos=True)
    _evaluate(llama, tokens[:64] + other, list(range(32, 64 + len(other), 32)))
    _greedy(llama, 16)
    again = _evaluate(llama, tokens, blocks, start=64)  # the cache cut back to the block boundary 64
    print(f"  blocks of 32 after another prompt, cut back to 64: identical logits: {bool((again == fresh).all())}")
    llama.close()


def _timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def batch_sizes(path: str, threads: int, rounds: int) -> None:
    """Part 2: prompt time by batch size, interleaved."""
    llama = _llama(path, threads)
    tokens = llama.tokenize((TEXT * 25).encode(), add_bos=True)[:1000]
    sizes = (16, 32, 64, 128, 512)
    times: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(rounds):
        for size in sizes:
            cuts = list(range(size, len(tokens), size))
            times[size].append(_timed(lambda cuts=cuts: _evaluate(llama, tokens, cuts)))
    print(f"a {len(tokens)}-token prompt, median of {rounds} interleaved rounds:")
    best = statistics.median(times[512])
    for size in sizes:
        median = statistics.median(times[size])
        print(f"  batches of {size:>3}: {median * 1000:7.1f} ms  ({median / best:.2f}x batches of 512)")
    llama.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a GGUF (default: the embedded SmolLM2)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    path = args.model or str(anyformer.default_model_path())
    from anyformer_llamacpp.engine import pick_threads

    threads = args.threads or pick_threads()
    shapes(path, threads)
    batch_sizes(path, threads, args.rounds)


if __name__ == "__main__":
    main()
