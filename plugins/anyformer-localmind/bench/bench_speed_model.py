"""How close ``check``'s modelled tok/s for LocalMind comes to the decode speed the engine then reaches.

In one process: the adapter's kernel costs are timed afresh (``--keep`` uses the kept ones), ``can_run``
models the decode speed of the file from its header, then the engine decodes ``--tokens`` greedy tokens
after an 8-token prompt (after a warm-up of 4) at the cache depth the model assumes, and the ratio
modelled / measured is printed for each ``--repeat``. The issue's target: within 30 % (0.7-1.3).

    python plugins/anyformer-localmind/bench/bench_speed_model.py [--model PATH | --random-smollm2]
        [--tokens 64] [--keys 256 2048] [--repeat 3] [--keep]

On lavapipe set ANYFORMER_SOFTWARE_GPU=1 and use ``--tokens 16``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

import anyformer
from anyformer_gguf_gpu import adapter_speed as adapter_speed_module
from anyformer_gguf_gpu.decode import greedy
from anyformer_gguf_gpu.decode_speed import DEFAULT_KEYS, decode_speed, formats_read
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.gpu import GPU
from anyformer_gguf_gpu.testing import RandomModel, write_random_gguf
from anyformer_gguf_gpu.transformer import TransformerEngine

#: SmolLM2-135M's shapes (speed does not depend on the weights' values).
SMOLLM2_SHAPES = RandomModel(
    n_layer=30, n_embd=576, n_head=9, n_kv=3, head_dim=64, n_ff=1536, n_ctx=8192, quant="Q4_1", n_vocab=49152
)


def measured_tok_per_sec(path: str, tokens: int, keys: int) -> float:
    """Greedy decode tok/s of the engine on ``path``, its cache about ``keys`` deep mid-run."""
    gpu = GPU()
    with GGUFFile(path) as gguf:
        prompt_len = max(8, keys - tokens // 2)
        engine = TransformerEngine(gpu, gguf, ctx=prompt_len + tokens + 16, max_batch=64)
    prompt = [int(i) for i in np.random.default_rng(0).integers(300, 30000, size=prompt_len)]
    list(greedy(engine, prompt[:8], 4))  # warm-up: first submissions, buffer mappings
    stream = greedy(engine, prompt, tokens + 1)
    next(stream)  # the prompt's prefill and first token are not decode
    start = time.perf_counter()
    count = sum(1 for _ in stream)
    seconds = time.perf_counter() - start
    engine.release()
    return count / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--random-smollm2", action="store_true")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keys", type=int, nargs="+", default=[DEFAULT_KEYS], help="cache depths to model and run at")
    parser.add_argument("--keep", action="store_true", help="use the kept adapter figures instead of timing anew")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="speed-model-")
    path = args.model or anyformer.default_model_path()
    if args.random_smollm2:
        path = os.path.join(folder, "random-smollm2.gguf")
        write_random_gguf(path, SMOLLM2_SHAPES)
    summary = anyformer.describe(str(path)).metadata["gguf"]
    software = os.environ.get("ANYFORMER_SOFTWARE_GPU") == "1"
    gpu = GPU()
    print(f"model: {path}\nadapter: {gpu.name}")
    f16 = gpu.has_f16
    gpu.close()
    for round_ in range(args.repeat):
        if not args.keep:
            adapter_speed_module._FOUND.clear()
            os.environ["ANYFORMER_HOME"] = os.path.join(folder, f"home{round_}")  # time afresh each round
        speed = adapter_speed_module.adapter_speed(software, formats_read(summary))
        print(f"round {round_}: adapter figures {speed.to_dict()}")
        for keys in args.keys:
            modelled = decode_speed(summary, speed, keys=keys, kv_f16=f16)
            assert modelled is not None
            measured = measured_tok_per_sec(str(path), args.tokens, keys)
            print(
                f"round {round_}, {keys} keys: modelled {modelled.tok_per_sec:.1f} tok/s ({modelled.why()}), "
                f"measured {measured:.1f} tok/s, ratio {modelled.tok_per_sec / measured:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
