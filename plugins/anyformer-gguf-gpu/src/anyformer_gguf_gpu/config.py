"""A decoder-only transformer's hyperparameters, read from the GGUF header (the shapes are the file's, not ours).

Any checkpoint of an architecture the engine reads runs: the dimensions come from the header's
``<arch>.*`` keys and are cross-checked against the tensors' shapes, so a header that lies about
them is a ``BAD_MODEL`` before a byte is uploaded.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Protocol

from anyformer.plugin import AnyformerError, ErrorCode, GGUFHeader, GGUFTensor

#: Architectures the engines read, with the rotary layout llama.cpp uses for each
#: (False: pairs (2i, 2i+1), llama.cpp's LLAMA_ROPE_TYPE_NORM; True: NEOX, pairs (i, i + n_rot/2)).
#: llama and qwen3 run on transformer.TransformerEngine, lfm2 on lfm2.Lfm2Engine (see engines.py).
ENGINE_ARCHITECTURES: dict[str, bool] = {"llama": False, "qwen3": True, "lfm2": True}

#: The ggml types the kernels read, by name (see quants.FORMATS).
READABLE_TYPES = frozenset({"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})


class HeadWidths:
    """The widths of all query and all key/value heads, for a config that has heads of ``head_dim``."""

    n_head: int
    n_kv: int
    head_dim: int

    @property
    def q_dim(self) -> int:
        """Width of all query heads together."""
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of all key (or value) heads together."""
        return self.n_kv * self.head_dim


@dataclasses.dataclass(frozen=True)
class ModelConfig(HeadWidths):
    """What the engine needs to know about one model."""

    architecture: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_kv: int
    head_dim: int
    n_rot: int
    rope_base: float
    rope_neox: bool
    eps: float
    n_vocab: int
    n_ctx_train: int
    qk_norm: bool
    tied_output: bool


def header_int(kv: dict[str, Any], key: str, default: int | None = None, *, uniform_list: bool = True) -> int:
    """The positive integer under ``key`` (or ``default``); ``BAD_MODEL`` where it is missing or not one.

    With ``uniform_list`` a per-layer array whose entries are all equal reads as that one value;
    without it any array is refused like any other non-integer.
    """
    value = kv.get(key, default)
    if uniform_list and isinstance(value, list):
        # Per-layer arrays (head counts of hybrid models): this engine needs one value for all layers.
        if value and all(v == value[0] for v in value):
            value = value[0]
        else:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{key} varies per layer, which this engine does not read")
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{key} is missing or not a positive integer ({value!r})")
    return value


def weights_problem(summary: dict[str, Any], unread: str) -> str | None:
    """Why the summary's weight types or rope scaling cannot be run, or None.

    ``unread`` ends the weight-type message (``"which the engine does not read"``), so each engine
    names what it is that does not read them.
    """
    types = summary.get("tensor_types")
    if isinstance(types, dict):
        other = sorted(set(types) - READABLE_TYPES)
        if other:
            return f"weights in {', '.join(other)}, {unread}"
    scaling = summary.get("rope_scaling")
    if scaling not in (None, "none"):
        return f"rope scaling {scaling!r} is not implemented"
    return None


def architecture_problem(summary: dict[str, Any]) -> str | None:
    """Why the engine cannot run a GGUF described by the core's header summary, or None.

    Used by ``can_run``: it reads only the summary (architecture, weight types, tokenizer, rope scaling).
    """
    arch = summary.get("architecture")
    if arch not in ENGINE_ARCHITECTURES:
        return f"architecture {arch!r}; the engines read {', '.join(ENGINE_ARCHITECTURES)}"
    problem = weights_problem(summary, "which the WGSL kernels do not read")
    if problem is not None:
        return problem
    if summary.get("expert_count"):
        return "mixture-of-experts layers are not implemented"
    return None


def read_config(header: GGUFHeader) -> ModelConfig:
    """The model's hyperparameters, checked against its tensors; ``BAD_MODEL`` where they disagree."""
    problem = architecture_problem(header.summary())
    if problem is not None:
        raise AnyformerError(ErrorCode.BAD_MODEL, problem)
    kv = header.kv
    arch = str(header.architecture)
    tensors = {t.name: t for t in header.tensors}
    dims = read_attention_dims(kv, arch)
    embd = required_tensor(tensors, "token_embd.weight")
    config = ModelConfig(
        architecture=arch,
        n_layer=header_int(kv, f"{arch}.block_count"),
        n_embd=dims.n_embd,
        n_ff=header_int(kv, f"{arch}.feed_forward_length"),
        n_head=dims.n_head,
        n_kv=dims.n_kv,
        head_dim=dims.head_dim,
        n_rot=dims.n_rot,
        rope_base=float(kv.get(f"{arch}.rope.freq_base", 10000.0)),  # type: ignore[arg-type]
        rope_neox=ENGINE_ARCHITECTURES[arch],
        eps=float(kv.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),  # type: ignore[arg-type]
        n_vocab=embd.dims[1] if len(embd.dims) == 2 else 0,
        n_ctx_train=header_int(kv, f"{arch}.context_length", 4096),
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        tied_output="output.weight" not in tensors,
    )
    _check_shapes(config, tensors)
    return config


@dataclasses.dataclass(frozen=True)
class AttentionDims:
    """The attention widths of a header, checked against each other (not yet against the tensors)."""

    n_embd: int
    n_head: int
    n_kv: int
    head_dim: int
    n_rot: int


def read_attention_dims(kv: dict[str, Any], arch: str, *, uniform_list: bool = True) -> AttentionDims:
    """Embedding width, query and KV heads, head width and rotary width from the ``<arch>.*`` keys.

    ``BAD_MODEL`` where one is missing or they do not fit together: heads that do not group,
    keys and values of different widths, a rotary width wider than a head or odd.
    """
    n_embd = header_int(kv, f"{arch}.embedding_length", uniform_list=uniform_list)
    n_head = header_int(kv, f"{arch}.attention.head_count", uniform_list=uniform_list)
    n_kv = header_int(kv, f"{arch}.attention.head_count_kv", n_head, uniform_list=uniform_list)
    if n_head % n_kv:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{n_head} query heads do not group over {n_kv} KV heads")
    head_dim = header_int(kv, f"{arch}.attention.key_length", n_embd // n_head, uniform_list=uniform_list)
    if kv.get(f"{arch}.attention.value_length", head_dim) != head_dim:
        raise AnyformerError(ErrorCode.BAD_MODEL, "key and value heads of different widths are not read")
    n_rot = header_int(kv, f"{arch}.rope.dimension_count", head_dim, uniform_list=uniform_list)
    if n_rot > head_dim or n_rot % 2:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"rope dimension {n_rot} does not fit heads of {head_dim}")
    return AttentionDims(n_embd=n_embd, n_head=n_head, n_kv=n_kv, head_dim=head_dim, n_rot=n_rot)


def required_tensor(tensors: dict[str, GGUFTensor], name: str) -> GGUFTensor:
    """The tensor called ``name``; ``BAD_MODEL`` where the file has none."""
    found = tensors.get(name)
    if found is None:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"no tensor {name}")
    return found


class DecoderShape(Protocol):
    """The widths a decoder's embedding, attention and norm tensors follow (ModelConfig, MoEConfig)."""

    @property
    def n_embd(self) -> int: ...

    @property
    def n_vocab(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def qk_norm(self) -> bool: ...

    @property
    def tied_output(self) -> bool: ...

    @property
    def q_dim(self) -> int: ...

    @property
    def kv_dim(self) -> int: ...


def embedding_shapes(c: DecoderShape) -> dict[str, tuple[int, ...]]:
    """Shapes of the token embedding, the final norm and (when not tied) the output matrix, ggml order."""
    want: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (c.n_embd, c.n_vocab),
        "output_norm.weight": (c.n_embd,),
    }
    if not c.tied_output:
        want["output.weight"] = (c.n_embd, c.n_vocab)
    return want


def layer_shapes(c: DecoderShape, prefix: str, ffn: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """One layer's shapes: norms and attention, then the engine's own feed-forward ``ffn`` (names
    without ``prefix``), then the q/k norms where the model has them; ggml order (cols first)."""
    want: dict[str, tuple[int, ...]] = {
        prefix + "attn_norm.weight": (c.n_embd,),
        prefix + "attn_q.weight": (c.n_embd, c.q_dim),
        prefix + "attn_k.weight": (c.n_embd, c.kv_dim),
        prefix + "attn_v.weight": (c.n_embd, c.kv_dim),
        prefix + "attn_output.weight": (c.q_dim, c.n_embd),
        prefix + "ffn_norm.weight": (c.n_embd,),
    }
    want.update({prefix + name: dims for name, dims in ffn.items()})
    if c.qk_norm:
        want[prefix + "attn_q_norm.weight"] = (c.head_dim,)
        want[prefix + "attn_k_norm.weight"] = (c.head_dim,)
    return want


def expect_shapes(want: dict[str, tuple[int, ...]], tensors: dict[str, GGUFTensor], unread: str) -> None:
    """Every tensor of ``want`` exists with that shape and a readable type, checked in ``want``'s order.

    ``BAD_MODEL`` at the first that does not; ``unread`` ends the message for a type no kernel reads.
    """
    for name, dims in want.items():
        found = required_tensor(tensors, name)
        if found.dims != dims:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{name} has shape {found.dims}, the header implies {dims}")
        if found.type_name not in READABLE_TYPES:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{name} is {found.type_name}, {unread}")


def _check_shapes(c: ModelConfig, tensors: dict[str, GGUFTensor]) -> None:
    """Every tensor the engine reads exists with the shape the hyperparameters imply (ggml order: cols first)."""
    want = embedding_shapes(c)
    for i in range(c.n_layer):
        ffn = {
            "ffn_gate.weight": (c.n_embd, c.n_ff),
            "ffn_up.weight": (c.n_embd, c.n_ff),
            "ffn_down.weight": (c.n_ff, c.n_embd),
        }
        want.update(layer_shapes(c, f"blk.{i}.", ffn))
    expect_shapes(want, tensors, "which the WGSL kernels do not read")


@dataclasses.dataclass(frozen=True)
class Footprint:
    """What the engine will hold on the GPU: weights, the KV cache at the context, and its buffers."""

    context: int
    weights_bytes: int
    kv_bytes: int
    buffer_bytes: int

    @property
    def gpu_bytes(self) -> int:
        """Everything together: the ``need`` of a budget refusal, and the estimate's ``gpu_bytes``."""
        return self.weights_bytes + self.kv_bytes + self.buffer_bytes


def _fact(summary: dict[str, Any], key: str) -> int | None:
    value = summary.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


#: Keys per workgroup of attention split along the sequence (one per thread of its scores loop).
ATTENTION_CHUNK = 256


def attention_chunks(ctx: int) -> int:
    """How many chunks of :data:`ATTENTION_CHUNK` keys a cache of ``ctx`` positions splits into."""
    return math.ceil(ctx / ATTENTION_CHUNK)


def attention_scratch_bytes(tokens: int, n_head: int, ctx: int, head_dim: int) -> int:
    """Bytes of the attention scratch for steps of up to ``tokens`` tokens: every head's scores over ``ctx``
    keys, then room for each chunk's partial result (max, sum, head_dim values) when attention splits."""
    return 4 * tokens * n_head * (ctx + attention_chunks(ctx) * (head_dim + 2))


def footprint(summary: dict[str, Any], context: int, max_batch: int, *, kv_f16: bool = False) -> Footprint:
    """The engine's GPU bytes for a GGUF described by the header summary (``data_bytes``, dims, vocab).

    The same arithmetic as :class:`TransformerEngine` allocates: weights as stored (raw blocks), a K
    and V cache per layer (f16 with ``kv_f16``, else f32), activations for ``max_batch`` tokens,
    logits, the attention scratch (scores and split partial results), the rope table and the id list.
    Unknown dims (a bare description) count as zero.
    """
    layers = _fact(summary, "block_count") or 0
    embd = _fact(summary, "embedding_length") or 0
    heads = _fact(summary, "head_count") or 0
    kv_heads = _fact(summary, "head_count_kv") or heads
    head_dim = _fact(summary, "key_length") or (embd // heads if heads else 0)
    vocab = _fact(summary, "vocab_size") or 0
    ff = _fact(summary, "feed_forward_length") or 4 * embd
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    activations = 4 * max_batch * (embd + q_dim + 2 * kv_dim + q_dim + 2 * ff + vocab)
    activations += attention_scratch_bytes(max_batch, heads, context, head_dim)
    tables = 4 * (context * (head_dim + 1) + 1)
    return Footprint(
        context=context,
        weights_bytes=_fact(summary, "data_bytes") or 0,
        kv_bytes=2 * layers * context * kv_dim * (2 if kv_f16 else 4),
        buffer_bytes=activations + tables,
    )
