"""Decode speed of the diskformer CPU engine against llama.cpp on the same random qwen3moe, as a ratio.

A random model (default 8 layers, 1024 wide, 64 experts of 512, top-8, Q8_0: ~0.9 GB of experts)
is written to a temporary folder; each engine prefills the same prompt and decodes the same number
of greedy tokens. The diskformer runs twice: with a cache that holds every expert and with one of
two layers' top-k experts (it reads from the file on almost every access). Usage:

    python plugins/anyformer-diskformer/bench/bench_decode.py [--tokens 32] [--layers 8] [--embd 1024]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

import anyformer
from anyformer import Request
from anyformer.plugin import read_gguf_header
from anyformer_diskformer.model import DiskformerModel
from anyformer_diskformer.plan import plan_from_header
from anyformer_diskformer.testing import TinyMoE, write_tiny_moe

PROMPT = [1, 60, 75, 82, 9, 100, 71, 12, 40, 41, 42, 43, 44, 45, 46, 47]


def llama_tok_per_sec(path: str, tokens: int, threads: int) -> float:
    """llama.cpp's greedy decode speed after the prompt (f32 KV cache, as the engine)."""
    from llama_cpp import Llama

    llm = Llama(path, n_ctx=256, n_threads=threads, type_k=0, type_v=0, verbose=False)
    llm.eval(PROMPT)
    token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    start = time.perf_counter()
    for _ in range(tokens):
        llm.eval([token])
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    elapsed = time.perf_counter() - start
    llm.close()
    return tokens / elapsed


def diskformer_tok_per_sec(path: str, tokens: int, pool: int | None, threads: int) -> tuple[float, float]:
    """The engine's greedy decode speed on ``threads`` threads after the prompt, and its cache's hit rate while
    decoding."""
    options: dict[str, object] = {"threads": threads}
    if pool:
        options["pool_bytes"] = pool
    model = DiskformerModel.open(anyformer.describe(path), Request(context=256, options=options), lambda e: None)
    try:
        engine = model.engine
        assert engine is not None
        logits = engine.forward(PROMPT, 0)[-1]
        before = (engine.cache.stats.hits, engine.cache.stats.misses)
        start = time.perf_counter()
        for step in range(tokens):
            logits = engine.forward([int(np.argmax(logits))], len(PROMPT) + step)[-1]
        elapsed = time.perf_counter() - start
        hits = engine.cache.stats.hits - before[0]
        misses = engine.cache.stats.misses - before[1]
    finally:
        model.dispose()
    return tokens / elapsed, hits / max(1, hits + misses)


def main() -> None:
    """Write the model, time each engine, print tok/s and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--embd", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="both engines' threads")
    parser.add_argument("--skip-llama", action="store_true", help="time the diskformer only")
    args = parser.parse_args()
    spec = TinyMoE(
        n_layer=args.layers,
        n_embd=args.embd,
        n_head=16,
        n_kv=4,
        head_dim=64,
        n_expert=args.experts,
        n_expert_used=8,
        n_ff_exp=512,
        quant="Q8_0",
        scale=0.02,
    )
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "bench-qwen3moe.gguf")
        write_tiny_moe(path, spec)
        plan = plan_from_header(read_gguf_header(path), 256)
        print(f"model: {os.path.getsize(path) / 1e6:.0f} MB, experts {plan.expert_bytes_total / 1e6:.0f} MB")
        reference = float("nan") if args.skip_llama else llama_tok_per_sec(path, args.tokens, args.threads)
        print(f"llama.cpp ({args.threads} threads): {reference:.1f} tok/s")
        for label, pool in (("every expert cached", None), ("two layers' top-k", 2 * plan.min_cache_bytes)):
            speed, hit_rate = diskformer_tok_per_sec(path, args.tokens, pool, args.threads)
            print(
                f"diskformer ({args.threads} threads), {label}: {speed:.1f} tok/s, "
                f"ratio {speed / reference:.3f} of llama.cpp, decode hit rate {hit_rate:.0%}"
            )


if __name__ == "__main__":
    main()
