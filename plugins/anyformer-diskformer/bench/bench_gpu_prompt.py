"""Time to first token and expert bytes read for one prompt on the wgpu engine, per expert-cache budget.

A random qwen3moe (default 4 layers, 512 wide, 64 experts of 256, top-8, Q8_0: 107 MB of experts) is written to
a folder (``--architecture gemma4``: a random Gemma 4 of the same widths, every fourth layer full attention with
heads twice as wide, the others sliding over a window of 16, a dense GELU MLP of ``--embd`` beside the experts;
``--architecture qwen35moe``: a random Qwen3.5 MoE, every fourth layer gated full attention, the others gated delta
nets of 4 key and 8 value heads of ``--embd`` / 8, a sigmoid-gated shared expert of ``--embd`` / 2);
for each budget a fresh model loads (cold cache, experts read with O_DIRECT where the file system allows), runs
the prompt's ids (``--prompt`` random tokens) and picks the first token; the time of that and the cache's
statistics are printed as a Markdown row. ``--prompt-step`` sets the load option (left out: the
engine's default; it is not passed at all then, so the script also runs on code without the option). Usage:

    ANYFORMER_SOFTWARE_GPU=1 python plugins/anyformer-diskformer/bench/bench_gpu_prompt.py [--prompt 64]
        [--architecture gemma4|qwen35moe]
"""

from __future__ import annotations

import argparse
import dataclasses
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


def run(path: str, ids: list[int], pool: int, step: int | None) -> tuple[float, int, object]:
    """(seconds to the first token, the token, the cache's statistics) of a fresh load with a ``pool``-byte cache."""
    options: dict[str, object] = {"device": "gpu", "pool_bytes": pool}
    if step is not None:
        options["prompt_step"] = step
    model = DiskformerModel.open(anyformer.describe(path), Request(context=len(ids) + 16, options=options), print)
    try:
        engine = model.engine
        assert engine is not None
        start = time.perf_counter()
        logits = engine.forward(ids, 0, every=False)[-1]
        token = int(np.argmax(logits))
        return time.perf_counter() - start, token, model.cache_stats
    finally:
        model.dispose()


def _sections(pairs: int) -> tuple[int, int, int, int]:
    """``pairs`` rotary pairs in three multi-section parts as even as can be (Qwen3.5's 11, 11, 10 of 32), none
    in the fourth."""
    third = pairs // 3
    return (pairs - 2 * third, third, third, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--embd", type=int, default=512)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--budgets", default="1,0.25", help="expert caches as fractions of every expert's bytes")
    parser.add_argument("--prompt-step", type=int, default=None, help="the prompt_step load option")
    parser.add_argument("--architecture", choices=("qwen3moe", "gemma4", "qwen35moe"), default="qwen3moe")
    parser.add_argument("--folder", default=tempfile.gettempdir())
    args = parser.parse_args()
    shape = f"{args.layers}x{args.embd}x{args.experts}"
    name = (
        f"bench-gpu-prompt-{shape}.gguf"
        if args.architecture == "qwen3moe"
        else f"bench-gpu-prompt-{args.architecture}-{shape}.gguf"
    )
    path = os.path.join(args.folder, name)
    spec = TinyMoE(
        n_layer=args.layers,
        n_embd=args.embd,
        n_head=8,
        n_kv=4,
        head_dim=args.embd // 8,
        n_expert=args.experts,
        n_expert_used=8,
        n_ff_exp=args.embd // 2,
        n_ctx=4096,
        quant="Q8_0",
    )
    if args.architecture == "gemma4":
        spec = dataclasses.replace(
            spec,
            architecture="gemma4",
            swa_pattern=tuple(i % 4 != 3 for i in range(args.layers)),
            n_swa=16,
            full_head_dim=args.embd // 4,
            full_kv=2,
            n_ff_shexp=args.embd,
            fused_gate_up=True,
        )
    if args.architecture == "qwen35moe":
        head = args.embd // 8
        spec = dataclasses.replace(
            spec,
            architecture="qwen35moe",
            attention_interval=4,
            ssm_k_heads=4,
            ssm_v_heads=8,
            ssm_head=head,
            n_rot=head // 2,  # partial rotary, as Qwen3.5's
            rope_sections=_sections(head // 4),
            n_ff_shexp=args.embd // 2,
        )
    if not os.path.exists(path):
        write_tiny_moe(path, spec, seed=7)
    plan = plan_from_header(read_gguf_header(path), 256, "gpu")
    vocab = int(read_gguf_header(path).summary()["vocab_size"])
    ids = [int(t) for t in np.random.default_rng(3).integers(3, vocab, size=args.prompt)]
    print(f"{path}: {plan.expert_bytes_total / 1e6:.0f} MB of experts, one {plan.one_expert_bytes / 1e3:.0f} kB")
    print("| budget | prompt step | time to first token | expert bytes read | lookups | hit rate | first token |")
    print("|---|---|---|---|---|---|---|")
    for fraction in (float(b) for b in args.budgets.split(",")):
        pool = max(plan.min_cache_bytes, int(plan.expert_bytes_total * fraction))
        seconds, token, stats = run(path, ids, pool, args.prompt_step)
        step = "default" if args.prompt_step is None else args.prompt_step
        print(
            f"| {fraction:.0%} | {step} | {seconds:.2f} s | {stats.bytes_read / 1e6:.1f} MB | {stats.lookups} | "  # type: ignore[attr-defined]
            f"{stats.hit_rate:.0%} | {token} |"  # type: ignore[attr-defined]
        )


if __name__ == "__main__":
    main()
