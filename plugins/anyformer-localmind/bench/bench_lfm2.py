"""Decode and prefill speed of the lfm2 engine against llama.cpp on the same random LFM2 GGUF.

Speed does not depend on the weights' values, so the file is random weights in LFM2-350M's shapes
(16 layers of 1024, 6 of them attention with 8 KV heads, ff 4608, vocabulary 65536, ``--quant``),
or ``--small`` shapes for a CPU adapter. Both engines run in this process, one after the other;
llama.cpp through ``bench_decode.bench_llama_cpp`` (a bare ``Llama.eval`` greedy loop).

    python plugins/anyformer-localmind/bench/bench_lfm2.py [--small] [--quant Q4_0]
        [--tokens 64] [--prompt 512] [--reference cpu|gpu|none]

On lavapipe set ANYFORMER_SOFTWARE_GPU=1 and use ``--small --tokens 16 --prompt 32``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time

# llama-cpp-python before numpy (see bench_decode.py: its CUDA build crashed loading a model otherwise).
try:
    import llama_cpp  # noqa: F401
except ImportError:
    pass
import numpy as np
from bench_decode import bench_llama_cpp

from anyformer_gguf_gpu.decode import greedy
from anyformer_gguf_gpu.engines import open_engine
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.gpu import GPU
from anyformer_gguf_gpu.testing_lfm2 import RandomLfm2, write_random_lfm2_gguf

#: LFM2-350M's shapes (its layer pattern: attention at 2, 5, 8, 10, 12 and 14).
LFM2_350M_SHAPES = RandomLfm2(
    n_layer=16,
    attention_layers=(2, 5, 8, 10, 12, 14),
    n_embd=1024,
    n_head=16,
    n_kv=8,
    n_ff=4608,
    n_ctx=4096,
    n_vocab=65536,
)
#: A tenth of that, for CPU adapters.
SMALL_SHAPES = RandomLfm2(
    n_layer=8, attention_layers=(2, 5), n_embd=256, n_head=4, n_kv=2, n_ff=768, n_ctx=1024, n_vocab=8192
)


def _prompt(n: int, vocab: int) -> list[int]:
    """The same prompt bench_decode gives llama.cpp (seed 0, ids past the byte tokens)."""
    return [int(i) for i in np.random.default_rng(0).integers(300, min(vocab, 30000), size=n)]


def bench_lfm2(path: str, tokens: int, prompt_len: int) -> dict[str, float]:
    """Load, decode ``tokens`` greedy tokens after 8, and prefill a ``prompt_len`` prompt; the figures."""
    start = time.perf_counter()
    gpu = GPU()
    with GGUFFile(path) as gguf:
        engine = open_engine(gpu, gguf, ctx=prompt_len + tokens + 8, max_batch=32)
    load_s = time.perf_counter() - start
    kernels = engine.kernels
    prompt = _prompt(prompt_len, engine.config.n_vocab)
    list(greedy(engine, prompt[:8], 4))  # warm-up
    kernels.encode_seconds = 0.0
    kernels.submissions = 0
    start = time.perf_counter()
    out = list(greedy(engine, prompt[:8], tokens))
    decode_s = time.perf_counter() - start
    steps = max(1, len(out))  # per token (a submission covers several decode steps)
    start = time.perf_counter()
    engine.prefill(prompt)
    engine.read_id(prompt_len)
    prefill_s = time.perf_counter() - start
    dispatches = engine.dispatches_per_token
    engine.release()
    return {
        "load_s": load_s,
        "decode_tok_s": len(out) / decode_s,
        "dispatches_per_token": float(dispatches),
        "encode_ms_per_token": 1e3 * kernels.encode_seconds / steps,
        "prefill_tok_s": prompt_len / prefill_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="a tenth of LFM2-350M's shapes (CPU adapters)")
    parser.add_argument("--quant", default="Q4_0", help="the matrices' type (Q4_0, Q4_1, Q8_0, F16, ...)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--reference", choices=["cpu", "gpu", "none"], default="cpu")
    parser.add_argument(
        "--flash-attn", action="store_true", help="llama.cpp with its flash-attention kernels on (off by default)"
    )
    args = parser.parse_args()
    spec = SMALL_SHAPES if args.small else LFM2_350M_SHAPES
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lfm2-shapes.gguf")
        write_random_lfm2_gguf(path, dataclasses.replace(spec, quant=args.quant))
        print(f"model: random LFM2 {'small' if args.small else '350M'} shapes, {args.quant}")
        ours = bench_lfm2(path, args.tokens, args.prompt)
        print(f"adapter: {GPU().name}")
        for key, value in ours.items():
            print(f"localmind lfm2 {key}: {value:.3f}")
        if args.reference != "none":
            theirs = bench_llama_cpp(path, args.tokens, args.prompt, args.reference == "gpu", args.flash_attn)
            for key, value in theirs.items():
                print(f"llama.cpp ({args.reference}) {key}: {value:.3f}")
            print(f"decode ratio localmind / llama.cpp: {ours['decode_tok_s'] / theirs['decode_tok_s']:.3f}")
            print(f"prefill ratio localmind / llama.cpp: {ours['prefill_tok_s'] / theirs['prefill_tok_s']:.3f}")


if __name__ == "__main__":
    main()
