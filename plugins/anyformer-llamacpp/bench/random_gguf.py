"""Random-weight GGUFs in a real model's shapes, with its real tokenizer, for speed runs where the file
itself cannot travel (the GPU machine takes 64 MiB at a time). Decode speed does not depend on the
weight values.

    python random_gguf.py export-tokenizer REAL.gguf tokenizer.json     # here: the tokenizer alone
    python random_gguf.py write tokenizer.json OUT.gguf [--quant Q4_1] [--shape 135m|1.7b]
                                                                     # there: SmolLM2's shapes
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

# SmolLM2-135M-Instruct's architecture, as its GGUF header states it.
SMOLLM2_135M = {
    "block_count": 30,
    "embedding_length": 576,
    "feed_forward_length": 1536,
    "attention.head_count": 9,
    "attention.head_count_kv": 3,
    "context_length": 8192,
    "rope.dimension_count": 64,
}
# SmolLM2-1.7B-Instruct's: a model ~12x larger, in the same vocabulary (bench_rpc's larger model).
SMOLLM2_1_7B = {
    "block_count": 24,
    "embedding_length": 2048,
    "feed_forward_length": 8192,
    "attention.head_count": 32,
    "attention.head_count_kv": 32,
    "context_length": 8192,
    "rope.dimension_count": 64,
}
SHAPES = {"135m": SMOLLM2_135M, "1.7b": SMOLLM2_1_7B}
_TOKENIZER_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.chat_template",
)


def export_tokenizer(real: Path, out: Path) -> None:
    """Write the tokenizer keys of a real GGUF as JSON (read with anyformer's bounded reader)."""
    from anyformer.files._gguf_header import read_gguf_header

    header = read_gguf_header(real)
    out.write_text(json.dumps({k: header.get(k) for k in _TOKENIZER_KEYS if header.get(k) is not None}))


def write(tokenizer: Path, out: Path, quant: str, shape: dict[str, int] = SMOLLM2_135M) -> None:
    """Write a random llama GGUF in ``shape`` (SmolLM2-135M's by default) with the exported tokenizer."""
    import gguf

    keys = json.loads(tokenizer.read_text())
    tokens = keys["tokenizer.ggml.tokens"]
    n_vocab, n_embd, n_ff = len(tokens), shape["embedding_length"], shape["feed_forward_length"]
    heads, kv_heads = shape["attention.head_count"], shape["attention.head_count_kv"]
    head_dim = n_embd // heads
    qtype = getattr(gguf.GGMLQuantizationType, quant)
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(f"random llama, {shape['block_count']} layers of width {n_embd}")
    for key, value in shape.items():
        writer.add_uint32(f"llama.{key}", value)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(100000.0)
    writer.add_tokenizer_model(keys["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(keys.get("tokenizer.ggml.pre", "default"))
    writer.add_token_list(tokens)
    writer.add_token_types(keys["tokenizer.ggml.token_type"])
    writer.add_token_merges(keys["tokenizer.ggml.merges"])
    writer.add_bos_token_id(keys["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(keys["tokenizer.ggml.eos_token_id"])
    if "tokenizer.chat_template" in keys:
        writer.add_chat_template(keys["tokenizer.chat_template"])

    def matrix(name: str, rows: int, cols: int) -> None:
        data = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
        raw = gguf.quants.quantize(data, qtype)
        writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)

    def vector(name: str, size: int) -> None:
        writer.add_tensor(name, np.ones(size, dtype=np.float32))

    matrix("token_embd.weight", n_vocab, n_embd)
    for i in range(shape["block_count"]):
        vector(f"blk.{i}.attn_norm.weight", n_embd)
        matrix(f"blk.{i}.attn_q.weight", heads * head_dim, n_embd)
        matrix(f"blk.{i}.attn_k.weight", kv_heads * head_dim, n_embd)
        matrix(f"blk.{i}.attn_v.weight", kv_heads * head_dim, n_embd)
        matrix(f"blk.{i}.attn_output.weight", n_embd, heads * head_dim)
        vector(f"blk.{i}.ffn_norm.weight", n_embd)
        matrix(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        matrix(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        matrix(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    vector("output_norm.weight", n_embd)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    """Dispatch the two steps."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    export = sub.add_parser("export-tokenizer")
    export.add_argument("real", type=Path)
    export.add_argument("out", type=Path)
    make = sub.add_parser("write")
    make.add_argument("tokenizer", type=Path)
    make.add_argument("out", type=Path)
    make.add_argument("--quant", default="Q4_1")
    make.add_argument("--shape", choices=sorted(SHAPES), default="135m", help="SmolLM2-135M's or SmolLM2-1.7B's")
    args = parser.parse_args()
    if args.step == "export-tokenizer":
        export_tokenizer(args.real, args.out)
    else:
        write(args.tokenizer, args.out, args.quant, SHAPES[args.shape])


if __name__ == "__main__":
    main()
