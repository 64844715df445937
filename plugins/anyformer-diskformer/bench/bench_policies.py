"""Expert-cache policies replayed on routing traces against Belady's optimum, at several cache sizes.

Traces:

- recorded: a tiny random qwen3moe (3 layers, 16 experts, top-4) generating ``--tokens`` tokens on the
  CPU engine with ``ANYFORMER_DISKFORMER_TRACE`` set, plus any trace files given with ``--trace``;
- synthetic, at Qwen3-30B-A3B's routing shape (128 experts, top-8, ``--layers`` layers): uniform
  routing (what random weights give, the worst case) and skewed routing (a Zipf popularity per layer
  and temporal locality, as trained routers show; see ``anyformer_diskformer.trace.skewed_trace``).

For each trace and each cache size (a fraction of all the model's experts, in expert slots), the
hit rate of LRU, LRFU, reuse (the default) and Belady's optimal demand-paged cache.

Usage: ``nice -n 10 python plugins/anyformer-diskformer/bench/bench_policies.py [--layers 8] [--tokens 64]
[--fractions 0.05,0.1,0.25,0.5] [--trace FILE ...]``
"""

from __future__ import annotations

import argparse
import os
import tempfile

from anyformer_diskformer.cache.policies import LRFU, LRU, LayerReuse, replay
from anyformer_diskformer.trace import Access, read_trace, replay_belady, skewed_trace


def record_tiny_trace(folder: str, tokens: int) -> list[Access]:
    """The routing trace of a tiny random qwen3moe generating ``tokens`` tokens on the CPU engine."""
    import anyformer
    from anyformer import GenerateOptions, Request
    from anyformer_diskformer.model import DiskformerModel
    from anyformer_diskformer.testing import TinyMoE, write_tiny_moe
    from anyformer_diskformer.trace import TRACE_ENV

    path = os.path.join(folder, "tiny-qwen3moe.gguf")
    write_tiny_moe(path, TinyMoE(n_layer=3, n_expert=16, n_expert_used=4, quant="F16"), seed=1)
    trace = os.path.join(folder, "tiny.jsonl")
    os.environ[TRACE_ENV] = trace
    try:
        request = Request(context=256, options={"device": "cpu", "prefetch": 0})
        model = DiskformerModel.open(anyformer.describe(path), request, lambda e: None)
    finally:
        del os.environ[TRACE_ENV]
    try:
        messages = [{"role": "user", "content": "Tell me about the sea."}]
        list(model.generate(messages, GenerateOptions(max_new_tokens=tokens, temperature=0.0)))
    finally:
        model.dispose()
    return read_trace(trace)


def rates(accesses: list[Access], n_layer: int, slots: int) -> dict[str, float]:
    """Each policy's hit rate over ``accesses`` with ``slots`` expert slots."""
    n = max(1, len(accesses))
    return {
        "lru": replay(accesses, slots, LRU()) / n,
        "lrfu": replay(accesses, slots, LRFU()) / n,
        "reuse": replay(accesses, slots, LayerReuse(n_layer)) / n,
        "belady": replay_belady(accesses, slots) / n,
    }


def main() -> None:
    """Replay every trace at every size and print a table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--fractions", default="0.05,0.1,0.25,0.5", help="cache sizes as fractions of all experts")
    parser.add_argument("--trace", action="append", default=[], help="a recorded trace file (repeatable)")
    args = parser.parse_args()
    fractions = [float(f) for f in args.fractions.split(",")]
    traces: list[tuple[str, list[Access], int, int]] = []
    with tempfile.TemporaryDirectory() as folder:
        traces.append((f"recorded, tiny qwen3moe, {args.tokens} tokens", record_tiny_trace(folder, args.tokens), 3, 48))
    for path in args.trace:
        accesses = read_trace(path)
        layers = 1 + max((layer for layer, _ in accesses), default=0)
        traces.append((f"recorded, {os.path.basename(path)}", accesses, layers, len(set(accesses))))
    every = args.layers * 128
    for name, zipf, stay in (("uniform", 0.0, 0.0), ("skewed (zipf 1.0, stay 0.5)", 1.0, 0.5)):
        accesses = skewed_trace(args.layers, 128, 8, args.tokens, zipf=zipf, stay=stay, seed=0)
        traces.append((f"synthetic {name}, {args.layers}x128 top-8", accesses, args.layers, every))
    print("| trace | slots (of all experts) | LRU | LRFU | reuse | Belady |")
    print("|---|---|---|---|---|---|")
    for name, accesses, n_layer, experts in traces:
        for fraction in fractions:
            slots = max(1, round(fraction * experts))
            r = rates(accesses, n_layer, slots)
            cells = " | ".join(f"{100 * r[k]:.0f} %" for k in ("lru", "lrfu", "reuse", "belady"))
            print(f"| {name} | {slots} ({100 * fraction:.0f} %) | {cells} |", flush=True)


if __name__ == "__main__":
    main()
