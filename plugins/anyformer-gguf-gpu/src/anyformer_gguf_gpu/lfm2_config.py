"""LFM2's hyperparameters from the GGUF header, checked against its tensors, and the lfm2 engine's GPU footprint.

LFM2 (and LFM2.5) layers are either gated short convolutions or grouped-query attention: the
header's per-layer ``lfm2.attention.head_count_kv`` array says which (0: a convolution layer).
llama.cpp's ``lfm2`` loader reads ``lfm2.shortconv.l_cache`` (the convolution's taps) and
``lfm2.attention.layer_norm_rms_epsilon``; its attention is n_embd wide (``attn_q`` and
``attn_output`` are n_embd × n_embd), with per-head q/k RMSNorm and NEOX RoPE; its final norm is
the tensor ``token_embd_norm``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from anyformer.plugin import AnyformerError, ErrorCode, GGUFHeader, GGUFTensor
from anyformer_gguf_gpu.config import Footprint, HeadWidths, expect_shapes, footprint, header_int, required_tensor

#: Most convolution taps the conv kernel holds (LFM2 and LFM2.5 use 3).
MAX_CONV_TAPS = 8

_UNREAD = "which the WGSL kernels do not read"


@dataclasses.dataclass(frozen=True)
class Lfm2Config(HeadWidths):
    """What the lfm2 engine needs to know about one model."""

    architecture: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_kv: int
    head_dim: int
    n_rot: int
    rope_base: float
    eps: float
    n_vocab: int
    n_ctx_train: int
    tied_output: bool
    #: Taps of each convolution layer's causal depthwise convolution.
    l_cache: int
    #: The layers that attend; every other layer is a short convolution.
    attention_layers: tuple[int, ...]
    #: llama.cpp's rope type for lfm2 is NEOX (pairs (i, i + n_rot/2)), and every attention layer norms q and k.
    rope_neox: bool = True
    qk_norm: bool = True

    def is_attention(self, layer: int) -> bool:
        """Whether ``layer`` attends (else it is a short convolution)."""
        return layer in self.attention_layers

    @property
    def conv_layers(self) -> tuple[int, ...]:
        """The short-convolution layers."""
        return tuple(i for i in range(self.n_layer) if i not in self.attention_layers)


def kv_heads_per_layer(value: Any, n_layer: int) -> list[int]:
    """The per-layer KV head counts (one integer stands for every layer); ``BAD_MODEL`` where malformed."""
    heads = [value] * n_layer if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(heads, list) or len(heads) != n_layer:
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"lfm2.attention.head_count_kv is not one count per layer ({value!r})"
        )
    if not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in heads):
        raise AnyformerError(ErrorCode.BAD_MODEL, f"lfm2.attention.head_count_kv has a non-count ({value!r})")
    return heads


def read_lfm2_config(header: GGUFHeader) -> Lfm2Config:
    """The model's hyperparameters, checked against its tensors; ``BAD_MODEL`` where they disagree."""
    kv = header.kv
    if header.architecture != "lfm2":
        raise AnyformerError(ErrorCode.BAD_MODEL, f"architecture {header.architecture!r} is not lfm2")
    if kv.get("lfm2.attention.causal", True) is False:
        raise AnyformerError(ErrorCode.BAD_MODEL, "a non-causal lfm2 (an embedding model) is not a text generator")
    window = kv.get("lfm2.attention.sliding_window", 0)
    if isinstance(window, int) and window > 0:
        raise AnyformerError(ErrorCode.BAD_MODEL, "sliding-window attention is not implemented")
    if kv.get("lfm2.expert_count"):
        raise AnyformerError(ErrorCode.BAD_MODEL, "mixture-of-experts layers are not implemented")
    n_layer = header_int(kv, "lfm2.block_count")
    heads = kv_heads_per_layer(kv.get("lfm2.attention.head_count_kv"), n_layer)
    attention = tuple(i for i, h in enumerate(heads) if h > 0)
    kv_counts = {heads[i] for i in attention}
    if len(kv_counts) > 1:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"the attention layers have different KV head counts {heads}")
    n_embd = header_int(kv, "lfm2.embedding_length")
    n_head = header_int(kv, "lfm2.attention.head_count")
    n_kv = kv_counts.pop() if kv_counts else n_head
    if n_head % n_kv:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{n_head} query heads do not group over {n_kv} KV heads")
    head_dim = header_int(kv, "lfm2.attention.key_length", n_embd // n_head)
    if n_head * head_dim != n_embd:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{n_head} heads of {head_dim} are not the width {n_embd}")
    n_rot = header_int(kv, "lfm2.rope.dimension_count", head_dim)
    if n_rot > head_dim or n_rot % 2:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"rope dimension {n_rot} does not fit heads of {head_dim}")
    l_cache = header_int(kv, "lfm2.shortconv.l_cache")
    if not 2 <= l_cache <= MAX_CONV_TAPS:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"a convolution of {l_cache} taps (2..{MAX_CONV_TAPS} are read)")
    tensors = {t.name: t for t in header.tensors}
    embd = required_tensor(tensors, "token_embd.weight")
    config = Lfm2Config(
        architecture="lfm2",
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=header_int(kv, "lfm2.feed_forward_length"),
        n_head=n_head,
        n_kv=n_kv,
        head_dim=head_dim,
        n_rot=n_rot,
        rope_base=float(kv.get("lfm2.rope.freq_base", 10000.0)),  # type: ignore[arg-type]
        eps=float(kv.get("lfm2.attention.layer_norm_rms_epsilon", 1e-5)),  # type: ignore[arg-type]
        n_vocab=embd.dims[1] if len(embd.dims) == 2 else 0,
        n_ctx_train=header_int(kv, "lfm2.context_length", 4096),
        tied_output="output.weight" not in tensors,
        l_cache=l_cache,
        attention_layers=attention,
    )
    _check_shapes(config, tensors)
    return config


def _check_shapes(c: Lfm2Config, tensors: dict[str, GGUFTensor]) -> None:
    """Every tensor the engine reads exists with the shape the hyperparameters imply (ggml order: cols first)."""
    want: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (c.n_embd, c.n_vocab),
        "token_embd_norm.weight": (c.n_embd,),
    }
    if not c.tied_output:
        want["output.weight"] = (c.n_embd, c.n_vocab)
    for i in range(c.n_layer):
        p = f"blk.{i}."
        want[p + "attn_norm.weight"] = (c.n_embd,)
        if c.is_attention(i):
            want[p + "attn_q.weight"] = (c.n_embd, c.q_dim)
            want[p + "attn_k.weight"] = (c.n_embd, c.kv_dim)
            want[p + "attn_v.weight"] = (c.n_embd, c.kv_dim)
            want[p + "attn_q_norm.weight"] = (c.head_dim,)
            want[p + "attn_k_norm.weight"] = (c.head_dim,)
            want[p + "attn_output.weight"] = (c.q_dim, c.n_embd)
        else:
            want[p + "shortconv.in_proj.weight"] = (c.n_embd, 3 * c.n_embd)
            want[p + "shortconv.conv.weight"] = (c.l_cache, c.n_embd)
            want[p + "shortconv.out_proj.weight"] = (c.n_embd, c.n_embd)
        want[p + "ffn_norm.weight"] = (c.n_embd,)
        want[p + "ffn_gate.weight"] = (c.n_embd, c.n_ff)
        want[p + "ffn_up.weight"] = (c.n_embd, c.n_ff)
        want[p + "ffn_down.weight"] = (c.n_ff, c.n_embd)
    expect_shapes(want, tensors, _UNREAD)


def lfm2_footprint(summary: dict[str, Any], context: int, max_batch: int, *, kv_f16: bool = False) -> Footprint:
    """The lfm2 engine's GPU bytes for a GGUF described by the header summary.

    As :func:`~anyformer_gguf_gpu.config.footprint`, but a K and V cache only for the attention
    layers (the nonzero entries of the per-layer ``head_count_kv``), plus the convolution's
    [B | C | x] activations for ``max_batch`` tokens and each convolution layer's rolling state
    (``MAX_CONV_TAPS - 1`` rows: the header summary does not carry the tap count).
    """
    heads = summary.get("head_count_kv")
    layers = summary.get("block_count")
    per_layer = heads if isinstance(heads, list) else None
    if per_layer is None and isinstance(layers, int) and isinstance(heads, int):
        per_layer = [heads] * layers
    per_layer = [h for h in per_layer or [] if isinstance(h, int) and not isinstance(h, bool)]
    attention = [h for h in per_layer if h > 0]
    conv_layers = len(per_layer) - len(attention)
    base = footprint(
        {**summary, "block_count": len(attention), "head_count_kv": max(attention, default=0)},
        context,
        max_batch,
        kv_f16=kv_f16,
    )
    embd = summary.get("embedding_length")
    embd = embd if isinstance(embd, int) and not isinstance(embd, bool) and embd > 0 else 0
    conv = 4 * (max_batch * 3 * embd + conv_layers * (MAX_CONV_TAPS - 1) * embd)
    return dataclasses.replace(base, buffer_bytes=base.buffer_bytes + conv)
