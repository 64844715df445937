"""A mixture-of-experts model's hyperparameters and which of its tensors are routed experts.

The shapes are the file's: every dimension comes from the GGUF header's ``<arch>.*`` keys and is
cross-checked against the tensors, so a header that lies is ``BAD_MODEL`` before any expert is read.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from anyformer.plugin import AnyformerError, ErrorCode, GGUFHeader, GGUFTensor
from anyformer_gguf_gpu.config import READABLE_TYPES

#: MoE architectures the engine runs, with llama.cpp's choice of normalising the top-k router
#: weights for each: qwen3moe renormalises the selected softmax weights to sum to 1, qwen2moe keeps
#: them as they are (and adds a shared expert behind a sigmoid gate).
MOE_ARCHITECTURES: dict[str, bool] = {"qwen3moe": True, "qwen2moe": False}

#: The three routed-expert tensors of a layer (ggml dims: cols, rows, experts).
EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")

_EXPERT_NAME = re.compile(r"^blk\.\d+\.ffn_(gate|up|down)_exps\.weight$")


def is_expert_tensor(name: str) -> bool:
    """Whether ``name`` is a routed-expert tensor (streamed from disk, never resident)."""
    return _EXPERT_NAME.match(name) is not None


@dataclasses.dataclass(frozen=True)
class MoEConfig:
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

    @property
    def q_dim(self) -> int:
        """Width of all query heads together."""
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of all key (or value) heads together."""
        return self.n_kv * self.head_dim


def _int(kv: dict[str, Any], key: str, default: int | None = None) -> int:
    value = kv.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{key} is missing or not a positive integer ({value!r})")
    return value


def moe_problem(summary: dict[str, Any]) -> str | None:
    """Why the engine cannot run a GGUF described by the core's header summary, or None."""
    arch = summary.get("architecture")
    if arch not in MOE_ARCHITECTURES:
        return f"architecture {arch!r} is not a mixture of experts this engine reads ({', '.join(MOE_ARCHITECTURES)})"
    types = summary.get("tensor_types")
    if isinstance(types, dict):
        other = sorted(set(types) - READABLE_TYPES)
        if other:
            return f"weights in {', '.join(other)}, which the engine does not read"
    scaling = summary.get("rope_scaling")
    if scaling not in (None, "none"):
        return f"rope scaling {scaling!r} is not implemented"
    return None


def read_moe_config(header: GGUFHeader) -> MoEConfig:
    """The model's hyperparameters, checked against its tensors; ``BAD_MODEL`` where they disagree."""
    problem = moe_problem(header.summary())
    if problem is not None:
        raise AnyformerError(ErrorCode.BAD_MODEL, problem)
    kv = header.kv
    arch = str(header.architecture)
    n_embd = _int(kv, f"{arch}.embedding_length")
    n_head = _int(kv, f"{arch}.attention.head_count")
    n_kv = _int(kv, f"{arch}.attention.head_count_kv", n_head)
    if n_head % n_kv:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{n_head} query heads do not group over {n_kv} KV heads")
    head_dim = _int(kv, f"{arch}.attention.key_length", n_embd // n_head)
    if kv.get(f"{arch}.attention.value_length", head_dim) != head_dim:
        raise AnyformerError(ErrorCode.BAD_MODEL, "key and value heads of different widths are not read")
    n_rot = _int(kv, f"{arch}.rope.dimension_count", head_dim)
    if n_rot > head_dim or n_rot % 2:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"rope dimension {n_rot} does not fit heads of {head_dim}")
    n_expert = _int(kv, f"{arch}.expert_count")
    n_used = _int(kv, f"{arch}.expert_used_count")
    if n_used > n_expert:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{n_used} experts used per token of {n_expert}")
    tensors = {t.name: t for t in header.tensors}
    embd = _need(tensors, "token_embd.weight")
    config = MoEConfig(
        architecture=arch,
        n_layer=_int(kv, f"{arch}.block_count"),
        n_embd=n_embd,
        n_head=n_head,
        n_kv=n_kv,
        head_dim=head_dim,
        n_rot=n_rot,
        rope_base=float(kv.get(f"{arch}.rope.freq_base", 10000.0)),  # type: ignore[arg-type]
        eps=float(kv.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),  # type: ignore[arg-type]
        n_vocab=embd.dims[1] if len(embd.dims) == 2 else 0,
        n_ctx_train=_int(kv, f"{arch}.context_length", 4096),
        n_expert=n_expert,
        n_expert_used=n_used,
        n_ff_exp=_int(kv, f"{arch}.expert_feed_forward_length"),
        norm_topk=MOE_ARCHITECTURES[arch],
        tied_output="output.weight" not in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        qkv_bias="blk.0.attn_q.bias" in tensors,
        n_ff_shexp=_int(kv, f"{arch}.expert_shared_feed_forward_length")
        if "blk.0.ffn_up_shexp.weight" in tensors
        else 0,
    )
    _check_shapes(config, tensors)
    return config


def _need(tensors: dict[str, GGUFTensor], name: str) -> GGUFTensor:
    found = tensors.get(name)
    if found is None:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"no tensor {name}")
    return found


def _check_shapes(c: MoEConfig, tensors: dict[str, GGUFTensor]) -> None:
    """Every tensor the engine reads exists with the shape the hyperparameters imply (ggml order: cols first)."""
    want: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (c.n_embd, c.n_vocab),
        "output_norm.weight": (c.n_embd,),
    }
    if not c.tied_output:
        want["output.weight"] = (c.n_embd, c.n_vocab)
    for i in range(c.n_layer):
        p = f"blk.{i}."
        want.update(
            {
                p + "attn_norm.weight": (c.n_embd,),
                p + "attn_q.weight": (c.n_embd, c.q_dim),
                p + "attn_k.weight": (c.n_embd, c.kv_dim),
                p + "attn_v.weight": (c.n_embd, c.kv_dim),
                p + "attn_output.weight": (c.q_dim, c.n_embd),
                p + "ffn_norm.weight": (c.n_embd,),
                p + "ffn_gate_inp.weight": (c.n_embd, c.n_expert),
                p + "ffn_gate_exps.weight": (c.n_embd, c.n_ff_exp, c.n_expert),
                p + "ffn_up_exps.weight": (c.n_embd, c.n_ff_exp, c.n_expert),
                p + "ffn_down_exps.weight": (c.n_ff_exp, c.n_embd, c.n_expert),
            }
        )
        if c.qk_norm:
            want[p + "attn_q_norm.weight"] = (c.head_dim,)
            want[p + "attn_k_norm.weight"] = (c.head_dim,)
        if c.qkv_bias:
            want.update({p + "attn_q.bias": (c.q_dim,), p + "attn_k.bias": (c.kv_dim,), p + "attn_v.bias": (c.kv_dim,)})
        if c.n_ff_shexp:
            want.update(
                {
                    p + "ffn_gate_inp_shexp.weight": (c.n_embd,),
                    p + "ffn_gate_shexp.weight": (c.n_embd, c.n_ff_shexp),
                    p + "ffn_up_shexp.weight": (c.n_embd, c.n_ff_shexp),
                    p + "ffn_down_shexp.weight": (c.n_ff_shexp, c.n_embd),
                }
            )
    for name, dims in want.items():
        found = _need(tensors, name)
        if found.dims != dims:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{name} has shape {found.dims}, the header implies {dims}")
        if found.type_name not in READABLE_TYPES:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{name} is {found.type_name}, which the engine does not read")
