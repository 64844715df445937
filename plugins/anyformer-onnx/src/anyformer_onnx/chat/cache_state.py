"""Cache entries that are not keys and values: the states of a hybrid decoder's linear-attention layers.

Qwen3.5 and Qwen3-Next interleave full-attention layers with gated-DeltaNet linear-attention
layers. transformers.js's exports (``getCacheNames`` / ``getCacheShapes`` for ``qwen3_next``,
``qwen3_5_text``) give a linear-attention layer ``i`` (the layer's own index, so the KV entries of
the full-attention layers skip those indices) two fixed-size states instead of a growing KV pair:

- ``past_conv.i`` → ``present_conv.i``: [batch, conv_dim, linear_conv_kernel_dim], the last
  ``linear_conv_kernel_dim`` inputs of the layer's causal depthwise convolution, conv_dim =
  2 × linear_num_key_heads × linear_key_head_dim + linear_num_value_heads × linear_value_head_dim;
- ``past_recurrent.i`` → ``present_recurrent.i``: [batch, linear_num_value_heads,
  linear_key_head_dim, linear_value_head_dim], the delta rule's state matrix per value head.

Both start as zeros (transformers' layers start from no state: a zero-padded convolution and a
zero recurrent state) and every step feeds back the step before's ``present`` values, whatever the
number of tokens the step carried. Shapes come from the graph's static dims, else config.json's.
Other states (LFM2's and the Mamba hybrids' ``past_ssm``, OLMo-hybrid's split convolution
states) are not read: :class:`~anyformer_onnx.chat.decoder.DecoderGraph` refuses them by name.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode

#: A linear-attention layer's state inputs, as transformers.js names them, with the output each pairs with.
_STATE = re.compile(r"^past_(conv|recurrent)\.(\d+)$")
_ELEMENT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


@dataclasses.dataclass(frozen=True)
class StateEntry:
    """One fixed-size state the loop carries: its input, its output, its zero start."""

    name: str
    present: str
    shape: tuple[int, ...]
    dtype: Any

    def initial(self) -> np.ndarray:
        """The state before the first step: zeros."""
        return np.zeros(self.shape, dtype=self.dtype)


def is_state(name: str) -> bool:
    """True for an input this module carries (``past_conv.N``, ``past_recurrent.N``)."""
    return _STATE.match(name) is not None


def _config_shape(kind: str, config: Mapping[str, Any]) -> tuple[int, ...] | None:
    keys = ("linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads", "linear_value_head_dim")
    found = [config.get(key) for key in (*keys, "linear_conv_kernel_dim")]
    values = [v for v in found if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    if len(values) != len(found):
        return None
    key_heads, key_dim, value_heads, value_dim, kernel = values
    if kind == "conv":
        return (1, 2 * key_heads * key_dim + value_heads * value_dim, kernel)
    return (1, value_heads, key_dim, value_dim)


def state_entries(
    inputs: Mapping[str, Any], outputs: list[str], config: Mapping[str, Any], label: str
) -> list[StateEntry]:
    """The graph's linear-attention states in layer order; ``BAD_MODEL`` for one the loop cannot start or feed back."""
    found = sorted((m for m in (_STATE.match(name) for name in inputs) if m), key=lambda m: (int(m.group(2)), m[1]))
    entries = []
    for match in found:
        name, kind = match.group(0), match.group(1)
        present = f"present_{kind}.{match.group(2)}"
        if present not in outputs:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: has {name} but no {present} to carry it on")
        arg = inputs[name]
        dtype = _ELEMENT_TYPES.get(arg.type)
        if dtype is None:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: {name} of type {arg.type}")
        dims = list(arg.shape)
        static = [d for d in dims[1:] if isinstance(d, int) and d > 0]
        shape = (1, *static) if dims and len(static) == len(dims) - 1 else _config_shape(kind, config)
        if shape is None or len(shape) != len(dims):
            raise AnyformerError(
                ErrorCode.BAD_MODEL,
                f"{label}: {name}'s shape is neither in the graph nor derivable from config.json's linear_* sizes",
            )
        entries.append(StateEntry(name, present, tuple(int(d) for d in shape), dtype))
    return entries
