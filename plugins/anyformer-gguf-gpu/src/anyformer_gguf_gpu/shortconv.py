"""The gated short-convolution kernel of LFM2 (``wgsl/shortconv.wgsl``) as ready-to-encode dispatches.

One thread per channel walks the step's tokens in order: u = B * x, a causal depthwise convolution
of u over the layer's ``taps`` taps (the inputs before the step kept on the GPU in a rolling state),
gated by C; ungated (qwen35moe's delta nets) the input is x alone and the output silu of the
convolution. The pipeline is compiled once per engine (at load, in its compile progress).
"""

from __future__ import annotations

import math
import struct
from importlib import resources
from typing import Any

from anyformer_gguf_gpu.gpu import gpu_errors
from anyformer_gguf_gpu.kernels import MAX_GROUPS, WORKGROUP, Dispatch, Kernels
from anyformer_gguf_gpu.lfm2_config import MAX_CONV_TAPS as MAX_TAPS


def shortconv_source(gated: bool = True) -> str:
    """The full WGSL of the kernel, with the workgroup size (``gated``: LFM2's B and C gates, else SiLU after)."""
    # The WGSL's window size is the same constant as the Python side's check.
    body = resources.files("anyformer_gguf_gpu").joinpath("wgsl", "shortconv.wgsl").read_text(encoding="utf-8")
    flag = "true" if gated else "false"
    return f"const WG: u32 = {WORKGROUP}u;\nconst MAX_TAPS: u32 = {MAX_TAPS}u;\nconst GATED: bool = {flag};\n{body}"


#: The binding number of the kernel's uniform block (after the four buffers it reads and writes).
UNIFORM_SLOT = 4


class ShortConvKernel:
    """The convolution pipeline on one GPU; :meth:`dispatch` binds it to one layer's buffers.

    The pipeline is compiled by :meth:`compile` (an engine passes it to ``Kernels.compile`` so that the
    load's progress counts it) or on the first dispatch.
    """

    def __init__(self, kernels: Kernels, *, gated: bool = True) -> None:
        self.kernels = kernels
        #: LFM2's gated convolution (rows [B | C | x]), or the ungated one with SiLU after (rows start with x).
        self.gated = gated
        self._pipeline: Any = None

    def compile(self) -> Any:
        """The compute pipeline, compiled now if it is not yet."""
        if self._pipeline is None:
            device = self.kernels.gpu.device
            with gpu_errors("compiling the shortconv kernel"):
                module = device.create_shader_module(code=shortconv_source(self.gated), label="shortconv")
                self._pipeline = device.create_compute_pipeline(
                    layout="auto", compute={"module": module, "entry_point": "main"}, label="shortconv"
                )
        return self._pipeline

    def dispatch(
        self,
        bcx: Any,
        taps: Any,
        state: Any,
        y: Any,
        pos_state: Any,
        *,
        n: int,
        n_taps: int,
        tokens: int,
        y_stride: int | None = None,
        x_stride: int | None = None,
    ) -> Dispatch:
        """y[t, c] = C[t, c] * conv(B * x)[t, c] for ``tokens`` rows of ``bcx`` ([B | C | x], 3n floats each);
        ungated, y[t, c] = silu(conv(x))[t, c] of rows whose first n floats are x, ``x_stride`` floats apart.

        ``taps`` holds n × ``n_taps`` f32 (the last tap on the current token), ``state`` the layer's
        rolling state (``MAX_TAPS - 1`` rows of n f32), ``pos_state`` the engine's 16-byte [pos, tokens, ...]
        block (a step at position 0 starts from a zero state).
        """
        if not 2 <= n_taps <= MAX_TAPS:
            raise ValueError(f"the kernel holds 2..{MAX_TAPS} taps, not {n_taps}")
        row = (3 * n if self.gated else n) if x_stride is None else x_stride
        params = struct.pack("<8I", n, n_taps, tokens, row, n if y_stride is None else y_stride, 0, 0, 0)
        groups = math.ceil(n / WORKGROUP)
        x = min(groups, MAX_GROUPS)
        return self.kernels.dispatch(
            "shortconv",
            self.compile(),
            [bcx, taps, state, y, pos_state],
            params,
            (x, math.ceil(groups / x), 1),
            uniform_slot=UNIFORM_SLOT,
        )
