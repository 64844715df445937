"""A mixture-of-experts model's hyperparameters and which of its tensors are routed experts.

The shapes are the file's: every dimension comes from the GGUF header's ``<arch>.*`` keys and is
cross-checked against the tensors, so a header that lies is ``BAD_MODEL`` before any expert is read.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

from anyformer.plugin import AnyformerError, ErrorCode, GGUFHeader, GGUFTensor
from anyformer_gguf_gpu.config import (
    HeadWidths,
    embedding_shapes,
    expect_shapes,
    header_int,
    layer_shapes,
    read_attention_dims,
    required_tensor,
)

#: llama.cpp's ``expert_gating_func`` values the engines implement: how router logits become probabilities.
GATING_FUNCS = {1: "softmax", 2: "sigmoid"}

#: The three routed-expert tensors of a layer (ggml dims: cols, rows, experts).
EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
#: Gate and up experts fused in one tensor (rows 2 * n_ff: gate's first), as Gemma 4's converter always writes them.
GATE_UP_EXPS = "ffn_gate_up_exps"

#: How a weight-type refusal ends: what does not read the type.
UNREAD = "which the engine does not read"

_EXPERT_NAME = re.compile(r"^blk\.\d+\.ffn_(gate|up|down|gate_up)_exps\.weight$")


def is_expert_tensor(name: str) -> bool:
    """Whether ``name`` is a routed-expert tensor (streamed from disk, never resident)."""
    return _EXPERT_NAME.match(name) is not None


def expert_shapes(
    tensors: Mapping[str, object], prefix: str, n_embd: int, n_ff_exp: int, n_expert: int
) -> dict[str, tuple[int, ...]]:
    """A MoE layer's routed-expert tensors and their ggml shapes: gate and up apart, or fused when the file has
    ``{prefix}ffn_gate_up_exps.weight``."""
    shapes: dict[str, tuple[int, ...]] = {"ffn_down_exps.weight": (n_ff_exp, n_embd, n_expert)}
    if f"{prefix}{GATE_UP_EXPS}.weight" in tensors:
        shapes[f"{GATE_UP_EXPS}.weight"] = (n_embd, 2 * n_ff_exp, n_expert)
    else:
        shapes["ffn_gate_exps.weight"] = (n_embd, n_ff_exp, n_expert)
        shapes["ffn_up_exps.weight"] = (n_embd, n_ff_exp, n_expert)
    return shapes


def layer_of(name: str) -> int:
    """The layer a ``blk.N.*`` tensor belongs to; -1 for tensors of no layer (embeddings, output)."""
    parts = name.split(".", 2)
    return int(parts[1]) if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit() else -1


@dataclasses.dataclass(frozen=True)
class MoEConfig(HeadWidths):
    """What the MoE engine needs to know about one model."""

    architecture: str
    n_layer: int
    n_embd: int
    n_head: int
    n_kv: int
    head_dim: int
    n_rot: int
    rope_base: float
    eps: float
    n_vocab: int
    n_ctx_train: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    norm_topk: bool
    tied_output: bool
    #: Per-head RMSNorm of q and k (qwen3moe).
    qk_norm: bool
    #: Biases on the q, k and v projections (qwen2moe).
    qkv_bias: bool
    #: Width of the always-on shared expert, 0 when there is none (qwen2moe has one).
    n_ff_shexp: int
    #: Whether the shared expert is scaled by sigmoid(x · ffn_gate_inp_shexp) (qwen2moe) or added as is (bailingmoe).
    shexp_gated: bool = False
    #: Factor on the routing weights after top-k (bailingmoe's expert_weights_scale; 1 elsewhere).
    weights_scale: float = 1.0
    #: NEOX rotary (pairs i, i + n_rot/2: the qwen MoEs) or the original one (adjacent pairs: bailingmoe).
    rope_neox: bool = True
    #: How router logits become the experts' probabilities: "softmax" or "sigmoid" (bailingmoe2).
    gating: str = "softmax"
    #: A per-layer bias added to the probabilities to choose the experts, not to weight them (``exp_probs_b``).
    probs_bias: bool = False
    #: Expert groups (0: none): only the ``n_group_used`` groups with the highest sums of their two best
    #: biased probabilities take part in the top-k (bailingmoe2, as DeepSeek V3).
    n_group: int = 0
    n_group_used: int = 0
    #: q, k and v as one ``attn_qkv`` matrix (bailingmoe2) instead of three.
    fused_qkv: bool = False
    #: The first layers are dense SwiGLU FFNs of ``n_ff`` (``leading_dense_block_count``, bailingmoe2).
    n_dense_lead: int = 0
    n_ff: int = 0

    #: qwen35moe (Qwen3.5/3.6): which layers are gated delta-net (linear attention) layers, the rest being
    #: full attention; the delta net's conv kernel width, key heads, value heads and head width (keys and
    #: values alike).
    recurrent: tuple[bool, ...] = ()
    ssm_conv: int = 0
    ssm_k_heads: int = 0
    ssm_v_heads: int = 0
    ssm_head: int = 0
    #: The q projection gives each head's query and then its output gate (sigmoid) side by side (qwen35moe).
    attn_gated: bool = False
    #: The norm before the FFN: ``ffn_norm`` or ``post_attention_norm`` (qwen35moe).
    ffn_norm: str = "ffn_norm"
    #: Interleaved multi-section rotary (qwen35moe's IMROPE): the sections' pair counts (t, h, w, e); for text
    #: the first three rotate by the position and the fourth by 0.
    rope_sections: tuple[int, ...] = ()

    def is_recurrent(self, layer: int) -> bool:
        """Whether ``layer`` is a gated delta-net layer (qwen35moe) rather than attention."""
        return bool(self.recurrent) and self.recurrent[layer]

    def is_moe_layer(self, layer: int) -> bool:
        """Whether ``layer`` routes to experts (the leading dense layers do not)."""
        return layer >= self.n_dense_lead


#: How a family's header gives its shared experts' width (:attr:`HeaderReading.shared_width`).
SharedWidth = Literal["one", "count", "count_shared"]
#: Fields a family's spec adds to the common reader's (kv, architecture, layers run).
ExtraFields = Callable[[dict[str, Any], str, int], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class HeaderReading:
    """How :func:`read_common_config` reads one family's header: what differs between the families of attention
    (or delta-net) layers and routed experts. A family's spec declares it; the reader compares no names."""

    #: llama.cpp's choice of renormalising the top-k router weights to sum to 1 (None: the header's
    #: ``expert_weights_norm`` says, as bailingmoe's and bailingmoe2's do).
    norm_topk: bool | None
    #: The first ``leading_dense_block_count`` layers are dense SwiGLU FFNs (bailingmoe2); else none is.
    leading_dense: bool = False
    #: The router's gating function is the header's ``expert_gating_func`` (bailingmoe2); else softmax.
    header_gating: bool = False
    #: The shared experts' width: ``"one"``, one expert of ``expert_shared_feed_forward_length`` where the file has
    #: one (the qwen MoEs); ``"count"``, ``expert_shared_count`` experts of ``expert_feed_forward_length``
    #: (bailingmoe); ``"count_shared"``, as many of ``expert_shared_feed_forward_length`` when the header gives it
    #: (bailingmoe2).
    shared_width: SharedWidth = "one"
    #: q, k and v as one ``attn_qkv`` matrix, with per-head q/k norms (bailingmoe2).
    fused_qkv: bool = False
    #: NEOX rotary (pairs i, i + n_rot/2: the qwen MoEs), else the original one over the whole head (bailingmoe).
    rope_neox: bool = True
    #: The family's own fields over the common ones (qwen35moe's delta nets); None: none.
    extra: ExtraFields | None = None


def _shared_width(kv: dict[str, Any], arch: str, rule: SharedWidth, has_shared: bool) -> int:
    """The shared experts' width by the family's rule (:attr:`HeaderReading.shared_width`)."""
    if rule == "count_shared":
        shared_each = config_count(kv, f"{arch}.expert_shared_feed_forward_length") or config_int(
            kv, f"{arch}.expert_feed_forward_length"
        )
        return config_int(kv, f"{arch}.expert_shared_count") * shared_each
    if rule == "count":
        return config_int(kv, f"{arch}.expert_shared_count") * config_int(kv, f"{arch}.expert_feed_forward_length")
    return config_int(kv, f"{arch}.expert_shared_feed_forward_length") if has_shared else 0


def read_common_config(header: GGUFHeader, reading: HeaderReading) -> MoEConfig:
    """The hyperparameters of a family of attention (or delta-net) layers and routed experts, read as its spec's
    ``reading`` says and checked against its tensors; ``BAD_MODEL`` where they disagree.

    :func:`~anyformer_diskformer.arch.registry.read_moe_config` picks the family's reader and calls this.
    """
    kv = header.kv
    arch = str(header.architecture)
    # Per-layer arrays are refused here, as any non-integer: the MoE engine reads one value for all layers.
    dims = read_attention_dims(kv, arch, uniform_list=False)
    n_expert = config_int(kv, f"{arch}.expert_count")
    n_used = config_int(kv, f"{arch}.expert_used_count")
    if n_used > n_expert:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{n_used} experts used per token of {n_expert}")
    tensors = {t.name: t for t in header.tensors}
    embd = required_tensor(tensors, "token_embd.weight")
    if "blk.0.attn_output.bias" in tensors:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"an attention output bias, {UNREAD}")
    norm = reading.norm_topk
    if norm is None:
        norm = bool(kv.get(f"{arch}.expert_weights_norm", False))
    # Ling 2.0's leading dense layers have no shared expert: look at the first MoE layer.
    dense_lead = config_count(kv, f"{arch}.leading_dense_block_count") if reading.leading_dense else 0
    first_moe = f"blk.{dense_lead}."
    has_shared = first_moe + "ffn_up_shexp.weight" in tensors
    gating = "softmax"
    if reading.header_gating:
        func = kv.get(f"{arch}.expert_gating_func")
        if func not in GATING_FUNCS:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"expert gating function {func!r}, {UNREAD}")
        gating = GATING_FUNCS[func]  # type: ignore[index]
    if not reading.rope_neox and dims.n_rot != dims.head_dim:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{arch} with a rotary width other than the head's, {UNREAD}")
    shared_width = _shared_width(kv, arch, reading.shared_width, has_shared)
    scale = kv.get(f"{arch}.expert_weights_scale", 1.0)
    n_group, n_group_used = (
        config_count(kv, f"{arch}.expert_group_count"),
        config_count(kv, f"{arch}.expert_group_used_count"),
    )
    if n_group > 1 and (n_expert % n_group or not 0 < n_group_used < n_group or n_expert // n_group < 2):
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"{n_expert} experts in {n_group} groups of which {n_group_used} are used"
        )
    # Multi-token-prediction layers (nextn) come after the model's own and are not run.
    n_layer = config_int(kv, f"{arch}.block_count") - config_count(kv, f"{arch}.nextn_predict_layers")
    if not 0 < n_layer or dense_lead >= n_layer:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{n_layer} layers of which {dense_lead} are dense")
    config = MoEConfig(
        architecture=arch,
        n_layer=n_layer,
        n_embd=dims.n_embd,
        n_head=dims.n_head,
        n_kv=dims.n_kv,
        head_dim=dims.head_dim,
        n_rot=dims.n_rot,
        rope_base=float(kv.get(f"{arch}.rope.freq_base", 10000.0)),  # type: ignore[arg-type]
        eps=float(kv.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),  # type: ignore[arg-type]
        n_vocab=embd.dims[1] if len(embd.dims) == 2 else 0,
        n_ctx_train=config_int(kv, f"{arch}.context_length", 4096),
        n_expert=n_expert,
        n_expert_used=n_used,
        n_ff_exp=config_int(kv, f"{arch}.expert_feed_forward_length"),
        norm_topk=norm,
        tied_output="output.weight" not in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors or reading.fused_qkv,
        qkv_bias="blk.0.attn_q.bias" in tensors,
        n_ff_shexp=shared_width if has_shared else 0,
        shexp_gated=first_moe + "ffn_gate_inp_shexp.weight" in tensors,
        # 0 means "no scaling" to llama.cpp.
        weights_scale=float(scale) if isinstance(scale, (int, float)) and scale else 1.0,
        rope_neox=reading.rope_neox,
        gating=gating,
        probs_bias=first_moe + "exp_probs_b.bias" in tensors,
        n_group=n_group if n_group > 1 else 0,
        n_group_used=n_group_used if n_group > 1 else 0,
        fused_qkv=reading.fused_qkv,
        n_dense_lead=dense_lead,
        n_ff=config_int(kv, f"{arch}.feed_forward_length") if dense_lead else 0,
    )
    if reading.extra is not None:
        config = dataclasses.replace(config, **reading.extra(kv, arch, n_layer))
    _check_shapes(config, tensors)
    return config


def _delta_net_shapes(c: MoEConfig, p: str) -> dict[str, tuple[int, ...]]:
    """A qwen35moe delta-net layer's tensors (ggml order) besides its FFN."""
    keys, values = c.ssm_k_heads * c.ssm_head, c.ssm_v_heads * c.ssm_head
    return {
        p + "attn_norm.weight": (c.n_embd,),
        p + "attn_qkv.weight": (c.n_embd, 2 * keys + values),
        p + "attn_gate.weight": (c.n_embd, values),
        p + "ssm_conv1d.weight": (c.ssm_conv, 2 * keys + values),
        p + "ssm_dt.bias": (c.ssm_v_heads,),
        p + "ssm_a": (c.ssm_v_heads,),
        p + "ssm_beta.weight": (c.n_embd, c.ssm_v_heads),
        p + "ssm_alpha.weight": (c.n_embd, c.ssm_v_heads),
        p + "ssm_norm.weight": (c.ssm_head,),
        p + "ssm_out.weight": (values, c.n_embd),
        p + "post_attention_norm.weight": (c.n_embd,),
    }


def config_int(kv: dict[str, Any], key: str, default: int | None = None) -> int:
    """A count the header gives once for every layer; ``BAD_MODEL`` for a per-layer list or anything but one."""
    return header_int(kv, key, default, uniform_list=False)


def config_count(kv: dict[str, Any], key: str) -> int:
    """An optional count that may be 0 (absent: 0); ``BAD_MODEL`` for anything but a whole number."""
    value = kv.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{key} is not a whole number ({value!r})")
    return value


def _check_shapes(c: MoEConfig, tensors: dict[str, GGUFTensor]) -> None:
    """Every tensor the engine reads exists with the shape the hyperparameters imply (ggml order: cols first)."""
    want = embedding_shapes(c)
    for i in range(c.n_layer):
        p = f"blk.{i}."
        ffn: dict[str, tuple[int, ...]]
        if not c.is_moe_layer(i):
            ffn = {
                "ffn_gate.weight": (c.n_embd, c.n_ff),
                "ffn_up.weight": (c.n_embd, c.n_ff),
                "ffn_down.weight": (c.n_ff, c.n_embd),
            }
        else:
            ffn = {
                "ffn_gate_inp.weight": (c.n_embd, c.n_expert),
                **expert_shapes(tensors, p, c.n_embd, c.n_ff_exp, c.n_expert),
            }
            if c.probs_bias:
                ffn["exp_probs_b.bias"] = (c.n_expert,)
        if c.is_recurrent(i):
            want.update(_delta_net_shapes(c, p))
            want.update({p + name: dims for name, dims in ffn.items()})
        else:
            want.update(layer_shapes(c, p, ffn))
        if c.ffn_norm != "ffn_norm" and not c.is_recurrent(i):
            del want[p + "ffn_norm.weight"]
            want[p + c.ffn_norm + ".weight"] = (c.n_embd,)
        if c.attn_gated and not c.is_recurrent(i):
            want[p + "attn_q.weight"] = (c.n_embd, 2 * c.q_dim)
        if c.fused_qkv:
            for name in "qkv":
                del want[p + f"attn_{name}.weight"]
            want[p + "attn_qkv.weight"] = (c.n_embd, c.q_dim + 2 * c.kv_dim)
        if not c.is_moe_layer(i):
            continue
        if c.qkv_bias:
            want.update({p + "attn_q.bias": (c.q_dim,), p + "attn_k.bias": (c.kv_dim,), p + "attn_v.bias": (c.kv_dim,)})
        if c.n_ff_shexp:
            if c.shexp_gated:
                want[p + "ffn_gate_inp_shexp.weight"] = (c.n_embd,)
            want.update(
                {
                    p + "ffn_gate_shexp.weight": (c.n_embd, c.n_ff_shexp),
                    p + "ffn_up_shexp.weight": (c.n_embd, c.n_ff_shexp),
                    p + "ffn_down_shexp.weight": (c.n_ff_shexp, c.n_embd),
                }
            )
    expect_shapes(want, tensors, UNREAD)
