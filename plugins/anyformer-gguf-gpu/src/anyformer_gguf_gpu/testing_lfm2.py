"""Random LFM2 GGUFs in the shapes llama.cpp reads for the ``lfm2`` architecture (for tests and benches).

An LFM2 model mixes gated short-convolution layers and grouped-query attention layers; which is
which is written in the header's per-layer ``lfm2.attention.head_count_kv`` array (0: a
convolution layer). The tensor names and shapes are llama.cpp's (``llama_model_lfm2``), in ggml
order (columns first); gguf-py takes them rows first:

- every layer: ``attn_norm`` (the operator norm), ``ffn_norm``, ``ffn_gate``/``ffn_up``/``ffn_down``;
- a convolution layer: ``shortconv.in_proj`` (n_embd → 3·n_embd: B, C, x), ``shortconv.conv``
  (n_embd rows of ``lfm2.shortconv.l_cache`` taps), ``shortconv.out_proj`` (n_embd → n_embd);
- an attention layer: ``attn_q``/``attn_k``/``attn_v``, ``attn_q_norm``/``attn_k_norm`` (one head
  wide), ``attn_output``;
- the final norm is ``token_embd_norm`` (not ``output_norm``), and ``output`` is absent when tied.

gguf-py is needed (a test dependency), imported only inside the writer.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from anyformer_gguf_gpu.quants import FORMATS
from anyformer_gguf_gpu.testing import _quant_tensor, add_tiny_tokenizer, finish_gguf, random_blocks, tiny_vocabulary

#: The K-quant block scale that gives weights of about the spread of ``scale`` 0.02 (as testing.py's).
_K_SCALE_PER_SCALE = 0.0005 / 0.02


@dataclasses.dataclass(frozen=True)
class RandomLfm2:
    """The shape of a random LFM2 test model."""

    n_layer: int = 4
    #: The layers that attend (the others are short convolutions).
    attention_layers: tuple[int, ...] = (1, 3)
    n_embd: int = 64
    n_head: int = 4
    n_kv: int = 2
    n_ff: int = 96
    #: Taps of the causal convolution (the current token and the l_cache - 1 before it).
    l_cache: int = 3
    n_ctx: int = 256
    tied: bool = True
    quant: str = "Q8_0"
    #: The convolution taps' type (real LFM2 GGUFs keep them F32: rows of 3 do not fill a quant block).
    conv_quant: str = "F32"
    rope_base: float = 1000000.0
    scale: float = 0.02
    n_vocab: int | None = None
    #: The tokenizer's pre-tokenizer name written in the header.
    pre: str = "gpt-2"

    @property
    def head_dim(self) -> int:
        """llama.cpp's lfm2 attention is n_embd wide: heads of n_embd / n_head."""
        return self.n_embd // self.n_head


def write_random_lfm2_gguf(path: str, spec: RandomLfm2, seed: int = 0) -> None:
    """Write a random LFM2 model of ``spec``'s shape, with the tiny byte-level BPE vocabulary, as a GGUF."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens = tiny_vocabulary(spec.n_vocab)
    n_vocab = len(tokens)
    w = gguf.GGUFWriter(path, "lfm2")
    w.add_block_count(spec.n_layer)
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    # One KV head count per layer: 0 marks a convolution layer.
    w.add_head_count_kv([spec.n_kv if i in spec.attention_layers else 0 for i in range(spec.n_layer)])
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_rope_freq_base(spec.rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_shortconv_l_cache(spec.l_cache)
    add_tiny_tokenizer(w, tokens, spec.pre)

    def matrix(name: str, rows: int, cols: int) -> None:
        if spec.quant.endswith("_K"):
            # K-quant blocks are random (gguf-py does not quantise to them): their scales follow spec.scale.
            fmt = next(f for f in FORMATS.values() if f.name == spec.quant)
            raw = random_blocks(fmt, rows * cols, rng, scale=_K_SCALE_PER_SCALE * spec.scale)
            w.add_tensor(name, raw.reshape(rows, -1), raw_dtype=gguf.GGMLQuantizationType[spec.quant])
            return
        values = rng.standard_normal((rows, cols)).astype(np.float32) * spec.scale * 8
        data, raw_dtype = _quant_tensor(values, spec.quant, rng)
        w.add_tensor(name, data, raw_dtype=raw_dtype)

    def vector(name: str, n: int) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    n, head = spec.n_embd, spec.head_dim
    kv_dim = spec.n_kv * head
    matrix("token_embd.weight", n_vocab, n)
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", n)
        if i in spec.attention_layers:
            matrix(p + "attn_q.weight", n, n)
            matrix(p + "attn_k.weight", kv_dim, n)
            matrix(p + "attn_v.weight", kv_dim, n)
            vector(p + "attn_q_norm.weight", head)
            vector(p + "attn_k_norm.weight", head)
            matrix(p + "attn_output.weight", n, n)
        else:
            matrix(p + "shortconv.in_proj.weight", 3 * n, n)
            # Taps near 1/l_cache keep the convolution's output on the scale of its input.
            taps = (rng.standard_normal((n, spec.l_cache)) * 0.5 + 1.0) / spec.l_cache
            data, raw_dtype = _quant_tensor(taps.astype(np.float32), spec.conv_quant, rng)
            w.add_tensor(p + "shortconv.conv.weight", data, raw_dtype=raw_dtype)
            matrix(p + "shortconv.out_proj.weight", n, n)
        vector(p + "ffn_norm.weight", n)
        matrix(p + "ffn_gate.weight", spec.n_ff, n)
        matrix(p + "ffn_up.weight", spec.n_ff, n)
        matrix(p + "ffn_down.weight", n, spec.n_ff)
    vector("token_embd_norm.weight", n)
    if not spec.tied:
        matrix("output.weight", n_vocab, n)
    finish_gguf(w)
