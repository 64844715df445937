"""The backend's decode speed against ``transformers.pipeline`` on the same weights, in one process.

A random llama in SmolLM2-135M's shapes (float32, CPU) is saved as safetensors; each round times a
greedy reply of ``--tokens`` tokens through ``anyformer.load(...).generate`` and through
``pipeline("text-generation")`` (which runs ``model.generate``), interleaved so that both see the
same machine. Prints each round and the median ratio (anyformer / pipeline; the target is >= 0.95).

    python plugins/anyformer-transformers/bench/bench_overhead.py --tokens 64 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from tiny_models import build_llama

#: SmolLM2-135M-Instruct's shapes (random weights over the tests' character vocabulary).
SMOLLM2_SHAPE = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import torch
    from transformers import pipeline

    import anyformer

    messages = [{"role": "user", "content": "Tell me about the sea."}]
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_llama(Path(tmp) / "smollm2-shapes", **SMOLLM2_SHAPE)
        reference = pipeline("text-generation", model=str(folder), dtype=torch.float32, device="cpu")
        # No end token: every reply is exactly --tokens long on both sides.
        ours_kwargs = {"max_new_tokens": args.tokens}
        theirs_kwargs = {"max_new_tokens": args.tokens, "min_new_tokens": args.tokens, "do_sample": False}
        ratios = []
        with anyformer.load(folder, backend="transformers", isolate=False) as model:
            list(model.generate(messages, max_new_tokens=4))  # warm up both
            reference(messages, max_new_tokens=4, do_sample=False)
            for round_ in range(args.rounds):
                start = time.perf_counter()
                chunks = list(model.generate(messages, **ours_kwargs))
                ours = chunks[-1].tokens / (time.perf_counter() - start)
                start = time.perf_counter()
                reference(messages, **theirs_kwargs)
                theirs = args.tokens / (time.perf_counter() - start)
                ratios.append(ours / theirs)
                figures = f"anyformer {ours:.1f} tok/s, pipeline {theirs:.1f} tok/s, ratio {ratios[-1]:.3f}"
                print(f"round {round_ + 1}: {figures}")
        print(f"median ratio {statistics.median(ratios):.3f} over {args.rounds} rounds of {args.tokens} tokens")


if __name__ == "__main__":
    main()
