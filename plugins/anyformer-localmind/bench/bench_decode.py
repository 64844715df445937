"""Decode and prefill speed of the LocalMind engine against llama.cpp (llama-cpp-python) on the same GGUF.

Both run in this process on the same file, one after the other:
- LocalMind: the greedy loop of anyformer-gguf-gpu (one queue submission per token, the sampled id
  kept on the GPU and read back two steps late), on the adapter wgpu picks;
- llama.cpp: a bare ``Llama.eval`` loop with a greedy argmax, on the CPU (``--reference cpu``) or
  with every layer offloaded (``--reference gpu``, a CUDA/Vulkan build of llama-cpp-python).

Reported: decode tok/s of each and the ratio, dispatches per token, CPU time spent encoding and
submitting per token (apart), weight bytes read per token and that traffic as a fraction of ``--peak-gbps``
(the GPU's memory bandwidth, e.g. 4800 for an H200), and prefill tok/s on a ``--prompt``-token prompt.

    python plugins/anyformer-localmind/bench/bench_decode.py [--model PATH | --random-smollm2]
        [--tokens 64] [--prompt 512] [--reference cpu|gpu|none] [--peak-gbps 4800]

On lavapipe set ANYFORMER_SOFTWARE_GPU=1 and use small numbers (``--tokens 16 --prompt 32``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

# llama-cpp-python first when it is there: a CUDA build of it made on the H200 machine segfaults while
# loading any model if the image's numpy was imported before it (seen 2026-11-30; cause not established).
try:
    import llama_cpp  # noqa: F401
except ImportError:
    pass
import numpy as np

import anyformer
from anyformer_gguf_gpu.decode import greedy
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.gpu import GPU
from anyformer_gguf_gpu.testing import RandomModel, write_random_gguf
from anyformer_gguf_gpu.transformer import TransformerEngine

#: SmolLM2-135M's shapes, for a random-weight file where the real one cannot be brought (speed does not
#: depend on the values).
SMOLLM2_SHAPES = RandomModel(
    n_layer=30, n_embd=576, n_head=9, n_kv=3, head_dim=64, n_ff=1536, n_ctx=8192, quant="Q4_1", n_vocab=49152
)


def _prompt(n: int, vocab: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(0).integers(300, min(vocab, 30000), size=n)]


def bench_localmind(path: str, tokens: int, prompt_len: int, peak_gbps: float | None) -> dict[str, float]:
    start = time.perf_counter()
    gpu = GPU()
    with GGUFFile(path) as gguf:
        engine = TransformerEngine(gpu, gguf, ctx=prompt_len + tokens + 8, max_batch=64)
    load_s = time.perf_counter() - start
    kernels = engine.kernels
    prompt = _prompt(prompt_len, engine.config.n_vocab)
    list(greedy(engine, prompt[:8], 4))  # warm-up: first submissions, buffer mappings
    kernels.encode_seconds = kernels.submit_seconds = 0.0
    kernels.submissions = 0
    start = time.perf_counter()
    out = list(greedy(engine, prompt[:8], tokens))
    decode_s = time.perf_counter() - start
    steps = max(1, len(out))  # per token: a submission now covers several decode steps
    weight_bytes = sum(w.nbytes for w in engine.weights.values())
    start = time.perf_counter()
    engine.prefill(prompt)
    engine.read_id(prompt_len)
    prefill_s = time.perf_counter() - start
    result = {
        "load_s": load_s,
        "decode_tok_s": len(out) / decode_s,
        "dispatches_per_token": float(engine.dispatches_per_token),
        "encode_ms_per_token": 1e3 * kernels.encode_seconds / steps,
        "submit_ms_per_token": 1e3 * kernels.submit_seconds / steps,
        "weight_mb_per_token": weight_bytes / 1e6,
        "prefill_tok_s": prompt_len / prefill_s,
    }
    if peak_gbps:
        result["bandwidth_fraction"] = weight_bytes * result["decode_tok_s"] / (peak_gbps * 1e9)
    engine.release()
    return result


def bench_llama_cpp(
    path: str, tokens: int, prompt_len: int, on_gpu: bool, flash_attn: bool = False
) -> dict[str, float]:
    import llama_cpp  # only when asked for: the GPU machine may have no llama-cpp-python

    threads = os.cpu_count() or 2
    llm = llama_cpp.Llama(
        model_path=path,
        n_ctx=prompt_len + tokens + 8,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        n_gpu_layers=-1 if on_gpu else 0,
        flash_attn=flash_attn,
        verbose=False,
    )
    prompt = _prompt(prompt_len, llm.n_vocab())
    llm.eval(prompt[:8])  # warm-up
    llm.reset()
    llm.eval(prompt[:8])
    start = time.perf_counter()
    for _ in range(tokens):
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
        llm.eval([int(np.argmax(logits))])
    decode_s = time.perf_counter() - start
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    prefill_s = time.perf_counter() - start
    llm.close()
    return {"decode_tok_s": tokens / decode_s, "prefill_tok_s": prompt_len / prefill_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a GGUF (default: the embedded SmolLM2-135M-Instruct Q4_1)")
    parser.add_argument("--random-smollm2", action="store_true", help="random weights in SmolLM2's shapes (Q4_1)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--reference", choices=["cpu", "gpu", "none"], default="cpu")
    parser.add_argument(
        "--flash-attn", action="store_true", help="llama.cpp with its flash-attention kernels on (off by default)"
    )
    parser.add_argument("--peak-gbps", type=float, default=None, help="the GPU's memory bandwidth in GB/s")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.random_smollm2:
            path = os.path.join(tmp, "smollm2-shapes-q4_1.gguf")
            write_random_gguf(path, SMOLLM2_SHAPES)
        else:
            path = args.model or str(anyformer.default_model_path())
        print(f"model: {path}")
        ours = bench_localmind(path, args.tokens, args.prompt, args.peak_gbps)
        print(f"adapter: {GPU().name}")
        for key, value in ours.items():
            print(f"localmind {key}: {value:.3f}")
        if args.reference != "none":
            theirs = bench_llama_cpp(path, args.tokens, args.prompt, args.reference == "gpu", args.flash_attn)
            for key, value in theirs.items():
                print(f"llama.cpp ({args.reference}) {key}: {value:.3f}")
            print(f"decode ratio localmind / llama.cpp: {ours['decode_tok_s'] / theirs['decode_tok_s']:.3f}")
            print(f"prefill ratio localmind / llama.cpp: {ours['prefill_tok_s'] / theirs['prefill_tok_s']:.3f}")


if __name__ == "__main__":
    main()
