"""Decode speed deep into the context: attention split along the sequence (flash-decoding) or not.

On random weights in SmolLM2-135M's shapes (``--random-smollm2``, Q4_1) or a GGUF, for each
``--depths`` position P: a P-token prompt is prefilled, then ``--tokens`` greedy tokens are timed
(from the first token out to the last, so neither the prefill nor the first token's latency
counts). LocalMind runs twice per depth, with attention split along the sequence past
``split_from`` keys (the engine's default) and with one workgroup per head at every length
(``split_from`` above the context); llama.cpp (``--reference gpu`` for its CUDA/Vulkan build, ``cpu``,
or ``none``) decodes at the same depth in the same run. Also reported: dispatches per token at
that depth.

    python plugins/anyformer-localmind/bench/bench_long_context.py --random-smollm2
        [--depths 8,1024,2048,4096] [--tokens 128] [--reference gpu]

On lavapipe set ANYFORMER_SOFTWARE_GPU=1 and use small numbers (``--depths 8,300 --tokens 8``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

# llama-cpp-python before numpy (see bench_decode.py).
try:
    import llama_cpp  # noqa: F401
except ImportError:
    pass
import numpy as np
from bench_decode import SMOLLM2_SHAPES

import anyformer
from anyformer_gguf_gpu.decode import greedy
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.gpu import GPU
from anyformer_gguf_gpu.testing import write_random_gguf
from anyformer_gguf_gpu.transformer import TransformerEngine


def _prompt(n: int, vocab: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(0).integers(300, min(vocab, 30000), size=n)]


def _timed_decode(engine: TransformerEngine, prompt: list[int], tokens: int) -> float:
    """Tokens per second from the first greedy token to the last of ``tokens`` more."""
    stream = greedy(engine, prompt, tokens + 1)
    next(stream)
    start = time.perf_counter()
    got = sum(1 for _ in stream)
    return got / (time.perf_counter() - start)


def bench_localmind(path: str, depths: list[int], tokens: int) -> dict[int, dict[str, float]]:
    gpu = GPU()
    with GGUFFile(path) as gguf:
        engine = TransformerEngine(gpu, gguf, ctx=max(depths) + tokens + 8, max_batch=64)
    default_split = engine.split_from
    prompt = _prompt(max(depths), engine.config.n_vocab)
    _timed_decode(engine, prompt[:8], 8)  # warm-up
    out: dict[int, dict[str, float]] = {}
    for depth in depths:
        row: dict[str, float] = {}
        for label, split_from in (("split", default_split), ("whole", 10**9)):
            engine.split_from = split_from
            row[f"{label}_tok_s"] = _timed_decode(engine, prompt[:depth], tokens)
        engine.split_from = default_split
        split = engine.split_attention(depth + 1)
        row["dispatches"] = float(len(engine.program(1, head=True, split=split, chained=True)))
        out[depth] = row
    engine.release()
    return out


def bench_llama_cpp(
    path: str, depths: list[int], tokens: int, on_gpu: bool, flash_attn: bool = False
) -> dict[int, float]:
    import llama_cpp

    threads = os.cpu_count() or 2
    llm = llama_cpp.Llama(
        model_path=path,
        n_ctx=max(depths) + tokens + 8,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        n_gpu_layers=-1 if on_gpu else 0,
        flash_attn=flash_attn,
        verbose=False,
    )
    prompt = _prompt(max(depths), llm.n_vocab())
    out: dict[int, float] = {}
    for depth in depths:
        llm.reset()
        llm.eval(prompt[:depth])
        start = time.perf_counter()
        for _ in range(tokens):
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
            llm.eval([int(np.argmax(logits))])
        out[depth] = tokens / (time.perf_counter() - start)
    llm.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a GGUF (default: the embedded SmolLM2-135M-Instruct Q4_1)")
    parser.add_argument("--random-smollm2", action="store_true", help="random weights in SmolLM2's shapes (Q4_1)")
    parser.add_argument("--depths", default="8,1024,2048,4096", help="prompt lengths to decode after")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reference", choices=["cpu", "gpu", "none"], default="none")
    parser.add_argument(
        "--flash-attn", action="store_true", help="llama.cpp with its flash-attention kernels on (off by default)"
    )
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        if args.random_smollm2:
            path = os.path.join(tmp, "smollm2-shapes-q4_1.gguf")
            write_random_gguf(path, SMOLLM2_SHAPES)
        else:
            path = args.model or str(anyformer.default_model_path())
        print(f"model: {path}")
        ours = bench_localmind(path, depths, args.tokens)
        print(f"adapter: {GPU().name}")
        theirs = (
            bench_llama_cpp(path, depths, args.tokens, args.reference == "gpu", args.flash_attn)
            if args.reference != "none"
            else {}
        )
        for depth in depths:
            row = ours[depth]
            line = (
                f"depth {depth}: localmind split {row['split_tok_s']:.1f} tok/s, one workgroup per head "
                f"{row['whole_tok_s']:.1f} tok/s (split/whole {row['split_tok_s'] / row['whole_tok_s']:.3f}), "
                f"{row['dispatches']:.0f} dispatches/token"
            )
            if depth in theirs:
                ratio = row["split_tok_s"] / theirs[depth]
                line += f"; llama.cpp ({args.reference}) {theirs[depth]:.1f} tok/s, ratio {ratio:.3f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
