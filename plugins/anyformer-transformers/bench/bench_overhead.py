"""The backend's decode speed against ``transformers.pipeline`` on the same weights, in one process.

A random llama in SmolLM2-135M's shapes (float32, CPU) is saved as safetensors; each round times a
greedy reply of ``--tokens`` tokens through ``anyformer.load(...).generate`` and through
``pipeline("text-generation")`` (which runs ``model.generate``), interleaved so that both see the
same machine. Prints each round and the median ratios (anyformer / pipeline speed; the target is
>= 0.95, an overhead of at most 5 %), both by wall time and by the process's CPU time (every
thread's; on a shared machine the CPU time is what each side itself spent, the wall time also
counts the other jobs), with the load average before and after. ``--threads`` sets torch's threads
for both sides (default 1: two sides of one thread each do not fight over the cores).
``--results FILE`` also writes the figures and the command to FILE.

    nice -n -10 python plugins/anyformer-transformers/bench/bench_overhead.py --tokens 64 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import platform
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
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--results", type=Path, default=None)
    args = parser.parse_args()

    import torch
    import transformers
    from transformers import pipeline

    import anyformer

    torch.set_num_threads(args.threads)
    lines = [f"command: {' '.join(['python', *sys.argv])} (niceness {os.nice(0)})"]
    lines.append(f"torch {torch.__version__}, transformers {transformers.__version__}, {platform.processor() or ''}")
    lines.append(f"threads {args.threads}, load average before {os.getloadavg()[0]:.1f}")
    for line in lines:
        print(line)

    messages = [{"role": "user", "content": "Tell me about the sea."}]
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_llama(Path(tmp) / "smollm2-shapes", **SMOLLM2_SHAPE)
        reference = pipeline("text-generation", model=str(folder), dtype=torch.float32, device="cpu")
        # No end token: every reply is exactly --tokens long on both sides.
        ours_kwargs = {"max_new_tokens": args.tokens}
        theirs_kwargs = {"max_new_tokens": args.tokens, "min_new_tokens": args.tokens, "do_sample": False}
        ratios, cpu_ratios = [], []
        with anyformer.load(folder, backend="transformers", isolate=False) as model:
            list(model.generate(messages, max_new_tokens=4))  # warm up both
            reference(messages, max_new_tokens=4, do_sample=False)
            for round_ in range(args.rounds):
                start, cpu = time.perf_counter(), time.process_time()
                chunks = list(model.generate(messages, **ours_kwargs))
                ours, ours_cpu = time.perf_counter() - start, time.process_time() - cpu
                assert chunks[-1].tokens == args.tokens, chunks[-1]
                start, cpu = time.perf_counter(), time.process_time()
                reference(messages, **theirs_kwargs)
                theirs, theirs_cpu = time.perf_counter() - start, time.process_time() - cpu
                ratios.append(theirs / ours)
                cpu_ratios.append(theirs_cpu / ours_cpu)
                line = (
                    f"round {round_ + 1}: anyformer {args.tokens / ours:.1f} tok/s ({ours_cpu:.2f} s CPU), "
                    f"pipeline {args.tokens / theirs:.1f} tok/s ({theirs_cpu:.2f} s CPU), "
                    f"ratio {ratios[-1]:.3f} wall, {cpu_ratios[-1]:.3f} CPU"
                )
                print(line)
                lines.append(line)
        summary = (
            f"median ratio {statistics.median(ratios):.3f} wall, {statistics.median(cpu_ratios):.3f} CPU time, "
            f"over {args.rounds} rounds of {args.tokens} tokens; load average after {os.getloadavg()[0]:.1f}"
        )
        print(summary)
        lines.append(summary)
    if args.results is not None:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
