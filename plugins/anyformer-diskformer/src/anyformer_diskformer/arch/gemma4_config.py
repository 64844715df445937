"""Gemma 4's MoE (``gemma4``): its per-layer shapes read from the header and checked against the tensors.

Gemma 4 alternates sliding-window and full-attention layers that differ in head width, KV heads,
rotary width and base; the full layers rotate with per-pair frequency factors (``rope_freqs``).
Each MoE layer runs a dense GELU MLP beside the routed GELU experts, both with norms of their own.
What the engine does not run is ``BAD_MODEL`` with the reason: per-layer embeddings, KV shared
between layers, and gate and up experts fused in one tensor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from anyformer.plugin import AnyformerError, ErrorCode, GGUFHeader, GGUFTensor
from anyformer_diskformer.arch.moe_config import MoEConfig, expert_shapes
from anyformer_gguf_gpu.config import expect_shapes, required_tensor

_UNREAD = "which the engine does not read"


@dataclasses.dataclass(frozen=True)
class Gemma4Config(MoEConfig):
    """A Gemma 4 MoE: :class:`MoEConfig` (its head fields are the full-attention layers') and per-layer facts."""

    #: Per layer: sliding-window attention (else full), query heads, KV heads, head width, rotary width.
    swa: tuple[bool, ...] = ()
    heads: tuple[int, ...] = ()
    kv_heads: tuple[int, ...] = ()
    head_dims: tuple[int, ...] = ()
    rots: tuple[int, ...] = ()
    #: Dense MLP width per layer, and whether each layer routes to experts.
    ffs: tuple[int, ...] = ()
    moe: tuple[bool, ...] = ()
    #: Per layer: a v projection (else the keys serve as values), a per-expert output scale, a layer scale.
    has_v: tuple[bool, ...] = ()
    expert_scale: tuple[bool, ...] = ()
    out_scale: tuple[bool, ...] = ()
    rope_base_swa: float = 10000.0
    n_swa: int = 0
    #: tanh soft-capping of the final logits (0: none).
    softcap: float = 0.0

    def is_moe_layer(self, layer: int) -> bool:
        """Whether ``layer`` routes to experts (it has a router)."""
        return self.moe[layer]

    def kv_rows(self, ctx: int, step: int = 1) -> tuple[int, ...]:
        """Rows of each layer's KV cache for a context of ``ctx``: ``ctx`` for a full layer; for a sliding layer a
        ring (position p at row p % rows) of n_swa + step - 1 rows, where ``step`` is the most tokens a step stores
        before its attention reads the ring: the step's last token must not overwrite a key its first token still
        sees (the first sees n_swa - 1 positions before it). Never more than ``ctx``."""
        ring = min(ctx, self.n_swa + max(1, step) - 1)
        return tuple(ring if sliding else ctx for sliding in self.swa)

    def kv_bytes(self, ctx: int, step: int = 1) -> int:
        """Bytes of every layer's f32 keys and values (:meth:`kv_rows`)."""
        rows = self.kv_rows(ctx, step)
        return sum(2 * 4 * rows[i] * self.kv_heads[i] * self.head_dims[i] for i in range(self.n_layer))

    def ring_resumes(self, ctx: int, step: int, length: int, n: int) -> bool:
        """Whether the KV a step ending at position ``length`` leaves (a prime's checkpoint) can resume at position
        ``n`` <= ``length``: each ring still holds the n_swa - 1 positions before ``n`` (it holds the last of its
        rows before ``length``; later rows are rewritten before they are read)."""
        ring = min(self.kv_rows(ctx, step), default=ctx)
        return n == 0 or max(0, n - self.n_swa + 1) >= length - ring


def _per_layer(kv: dict[str, Any], key: str, n: int, default: int | None = None) -> tuple[int, ...]:
    """A positive count for every layer: one value for all, or a list of ``n``; ``BAD_MODEL`` otherwise."""
    value = kv.get(key, default)
    values = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value] * n
    counts = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    if len(values) != n or len(counts) != n:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{key} is not a positive count for each of {n} layers")
    return tuple(counts)


def _positive(kv: dict[str, Any], key: str, default: int | None = None) -> int:
    return _per_layer(kv, key, 1, default)[0]


def read_gemma4_config(header: GGUFHeader) -> Gemma4Config:
    """A ``gemma4`` GGUF's hyperparameters, checked against its tensors; ``BAD_MODEL`` where the engine cannot
    run it as llama.cpp does."""
    kv, arch = header.kv, "gemma4"
    tensors = {t.name: t for t in header.tensors}
    n_layer = _positive(kv, f"{arch}.block_count")
    if kv.get(f"{arch}.embedding_length_per_layer_input", 0):
        raise AnyformerError(ErrorCode.BAD_MODEL, f"per-layer embeddings, {_UNREAD}")
    if kv.get(f"{arch}.attention.shared_kv_layers", 0):
        raise AnyformerError(ErrorCode.BAD_MODEL, f"KV shared between layers, {_UNREAD}")
    pattern = kv.get(f"{arch}.attention.sliding_window_pattern")
    if not isinstance(pattern, Sequence) or len(pattern) < n_layer:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{arch}.attention.sliding_window_pattern does not list every layer")
    swa = tuple(bool(v) for v in list(pattern)[:n_layer])
    n_embd = _positive(kv, f"{arch}.embedding_length")
    heads = _per_layer(kv, f"{arch}.attention.head_count", n_layer)
    kv_heads = _per_layer(kv, f"{arch}.attention.head_count_kv", n_layer, heads[0])
    full_dim = _positive(kv, f"{arch}.attention.key_length")
    swa_dim = _positive(kv, f"{arch}.attention.key_length_swa")
    if kv.get(f"{arch}.attention.value_length", full_dim) != full_dim or (
        kv.get(f"{arch}.attention.value_length_swa", swa_dim) != swa_dim
    ):
        raise AnyformerError(ErrorCode.BAD_MODEL, "key and value heads of different widths are not read")
    full_rot = _positive(kv, f"{arch}.rope.dimension_count", full_dim)
    swa_rot = _positive(kv, f"{arch}.rope.dimension_count_swa", full_rot)
    head_dims = tuple(swa_dim if s else full_dim for s in swa)
    rots = tuple(swa_rot if s else full_rot for s in swa)
    for i in range(n_layer):
        if heads[i] % kv_heads[i] or rots[i] > head_dims[i] or rots[i] % 2:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"layer {i}: heads or rotary width that do not fit, {_UNREAD}")
    n_expert = _positive(kv, f"{arch}.expert_count")
    n_used = _positive(kv, f"{arch}.expert_used_count")
    if n_used > n_expert:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{n_used} experts used per token of {n_expert}")
    embd = required_tensor(tensors, "token_embd.weight")
    scale = kv.get(f"{arch}.final_logit_softcapping", 0.0)
    full = next((i for i in range(n_layer) if not swa[i]), 0)
    config = Gemma4Config(
        architecture=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=heads[full],
        n_kv=kv_heads[full],
        head_dim=full_dim,
        n_rot=full_rot,
        rope_base=float(kv.get(f"{arch}.rope.freq_base", 10000.0)),  # type: ignore[arg-type]
        eps=float(kv.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),  # type: ignore[arg-type]
        n_vocab=embd.dims[1] if len(embd.dims) == 2 else 0,
        n_ctx_train=_positive(kv, f"{arch}.context_length", 4096),
        n_expert=n_expert,
        n_expert_used=n_used,
        n_ff_exp=_positive(kv, f"{arch}.expert_feed_forward_length"),
        norm_topk=True,
        tied_output="output.weight" not in tensors,
        qk_norm=True,
        qkv_bias=False,
        n_ff_shexp=0,
        swa=swa,
        heads=heads,
        kv_heads=kv_heads,
        head_dims=head_dims,
        rots=rots,
        ffs=_per_layer(kv, f"{arch}.feed_forward_length", n_layer),
        moe=tuple(f"blk.{i}.ffn_gate_inp.weight" in tensors for i in range(n_layer)),
        has_v=tuple(f"blk.{i}.attn_v.weight" in tensors for i in range(n_layer)),
        expert_scale=tuple(f"blk.{i}.ffn_down_exps.scale" in tensors for i in range(n_layer)),
        out_scale=tuple(f"blk.{i}.layer_output_scale.weight" in tensors for i in range(n_layer)),
        rope_base_swa=float(kv.get(f"{arch}.rope.freq_base_swa", 10000.0)),  # type: ignore[arg-type]
        n_swa=_positive(kv, f"{arch}.attention.sliding_window"),
        softcap=float(scale) if isinstance(scale, (int, float)) else 0.0,
    )
    if not any(config.moe):
        raise AnyformerError(ErrorCode.BAD_MODEL, "no layer routes to experts")
    _check_shapes(config, tensors)
    return config


def _check_shapes(c: Gemma4Config, tensors: dict[str, GGUFTensor]) -> None:
    """Every tensor the engine reads, with the shape the header implies (ggml order: cols first)."""
    want: dict[str, tuple[int, ...]] = {"token_embd.weight": (c.n_embd, c.n_vocab), "output_norm.weight": (c.n_embd,)}
    if not c.tied_output:
        want["output.weight"] = (c.n_embd, c.n_vocab)
    if not all(c.swa):
        want["rope_freqs.weight"] = (c.head_dim // 2,)
    for i in range(c.n_layer):
        p, d, e = f"blk.{i}.", c.head_dims[i], c.n_embd
        q, k = c.heads[i] * d, c.kv_heads[i] * d
        layer = {
            "attn_norm.weight": (e,),
            "attn_q.weight": (e, q),
            "attn_k.weight": (e, k),
            "attn_output.weight": (q, e),
            "attn_q_norm.weight": (d,),
            "attn_k_norm.weight": (d,),
            "post_attention_norm.weight": (e,),
            "ffn_norm.weight": (e,),
            "ffn_gate.weight": (e, c.ffs[i]),
            "ffn_up.weight": (e, c.ffs[i]),
            "ffn_down.weight": (c.ffs[i], e),
            "post_ffw_norm.weight": (e,),
        }
        if c.has_v[i]:
            layer["attn_v.weight"] = (e, k)
        if c.out_scale[i]:
            layer["layer_output_scale.weight"] = (1,)
        if c.moe[i]:
            layer.update(
                {
                    "ffn_gate_inp.weight": (e, c.n_expert),
                    "ffn_gate_inp.scale": (e,),
                    "pre_ffw_norm_2.weight": (e,),
                    "post_ffw_norm_1.weight": (e,),
                    "post_ffw_norm_2.weight": (e,),
                    **expert_shapes(tensors, p, e, c.n_ff_exp, c.n_expert),
                }
            )
            if c.expert_scale[i]:
                layer["ffn_down_exps.scale"] = (c.n_expert,)
        want.update({p + name: dims for name, dims in layer.items()})
    expect_shapes(want, tensors, _UNREAD)
