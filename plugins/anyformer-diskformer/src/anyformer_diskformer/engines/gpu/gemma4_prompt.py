"""Prompt steps of several tokens for Gemma 4 on wgpu
(:class:`~anyformer_diskformer.engines.gpu.gemma4.Gemma4GpuEngine`).

The host side is :class:`~anyformer_diskformer.engines.gpu.prompt.PromptSteps`'s: per MoE layer one submission runs the
step's attention, dense MLP and router over its tokens, the router's logits of every token are read back once, the
union of the step's experts is fetched through the cache once each (in groups the cache holds), each expert's
products run over the rows routed to it, and one combine adds each token's weighted expert rows. What Gemma 4
changes, in the dispatches built here:

- every layer has its own head width and KV width (sliding and full layers): each layer's q/k/v rows have their own
  stride in the shared buffer, and its rope_store and attention dispatches are built with its own widths, rotary
  width and table;
- a sliding layer's token at position p sees positions p - n_swa + 1 .. p, the step's later tokens masked (the
  attention kernel's window over the layer's KV ring, indexed by the kernels as the one-token step's: the ring has
  n_swa + prompt_step - 1 rows, so the step's last key does not overwrite one its first token sees); a layer
  without ``attn_v`` takes its keys as values (k's product again, stacked in v's place at load);
- the dense GELU MLP runs beside the experts over the step's rows (``ffn_norm`` fused into gate and up);
- the experts normalise their input with ``pre_ffw_norm_2`` and gate with GELU; each token's combine weight is the
  router weight times the expert's ``ffn_down_exps.scale``, and the combine adds into the experts' rows (zeroed by
  a copy before the layer's experts), not the residual;
- three norms finish a MoE layer (the MLP's, the experts', their sum's into the residual times
  ``layer_output_scale``); a layer without a router adds its MLP's norm alone, with nothing read back;
- the embeddings are scaled by sqrt(n_embd) and the logits soft-capped as the one-token step does.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from anyformer_diskformer.arch.gemma4_config import Gemma4Config
from anyformer_diskformer.compute.routing import route
from anyformer_diskformer.engines.gpu.prompt import Fixed, PromptEngine, PromptSteps
from anyformer_gguf_gpu.kernels import Dispatch


class Gemma4PromptEngine(PromptEngine, Protocol):
    """What :class:`Gemma4PromptSteps` reads of Gemma 4's engine
    (:class:`~anyformer_diskformer.engines.gpu.gemma4.Gemma4GpuEngine`) besides :class:`PromptEngine`'s."""

    @property
    def config(self) -> Gemma4Config:
        """Gemma 4's hyperparameters, per layer."""
        ...

    #: Host copies of the tensors the host side reads (the experts' output scales).
    host: dict[str, np.ndarray]
    #: The experts' combined rows, and zeros to clear them from.
    routed: Any
    zeros: Any

    def embed_dispatch(self, tokens: int) -> Dispatch:
        """The scaled embedding of the step's ``tokens`` ids."""
        ...

    def mlp_dispatches(self, i: int, tokens: int, gate_up: Any) -> list[Dispatch]:
        """Layer ``i``'s dense MLP over ``tokens`` rows, its [gate | up] rows in ``gate_up``."""
        ...

    def router_norm(self, i: int) -> dict[str, Any]:
        """The router's fused input norm of layer ``i`` (the matvec kernel's options)."""
        ...

    def finish_dispatches(self, i: int, tokens: int) -> list[Dispatch]:
        """What ends layer ``i`` after its experts (the norms into the residual)."""
        ...


class Gemma4PromptSteps(PromptSteps):
    """:class:`PromptSteps` over Gemma 4's layers (see the module's docstring)."""

    engine: Gemma4PromptEngine
    gelu = True

    def _router_width(self) -> int:
        return self.engine.config.n_expert  # no shared expert's gate

    def _dense_ff(self) -> int:
        return max(self.engine.config.ffs)  # every layer's MLP runs over the step's rows

    def _expert_norm(self, layer: int) -> Any:
        return self.engine.norms[f"blk.{layer}.pre_ffw_norm_2.weight"]

    def _build(self, n: int) -> Fixed:
        e, c, k = self.engine, self.engine.config, self.engine.kernels
        layers, dense, finish = [], [], []
        for i in range(c.n_layer):
            out = e.attention_dispatches_for(i, n) + e.mlp_dispatches(i, n, self.gate_up)
            if c.moe[i]:
                w = e.weights[f"blk.{i}.ffn_gate_inp.weight"]
                out.append(e.mv(w, e.h, self.router, tokens=n, y_stride=self.width, **e.router_norm(i)))
            layers.append(out)
            ends = e.finish_dispatches(i, n)
            dense.append([] if c.moe[i] else ends)
            finish.append(ends if c.moe[i] else [])
        combine = k.moe_combine(self.out, self.table, e.routed, c.n_embd, self.m, tokens=n)
        return Fixed(
            e.embed_dispatch(n),
            layers,
            dense,
            [[] for _ in range(c.n_layer)],
            combine,
            finish=finish,
            # The experts' rows start from zero: the combine adds each token's weighted experts into them.
            before_experts=[(e.zeros, 0, e.routed, 0, 4 * n * c.n_embd)],
        )

    def _route(self, layer: int, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Softmax, top-k, renormalised (as the one-token step), each weight times its expert's output scale."""
        c = self.engine.config
        chosen, weights = route(logits, c.n_expert_used, True)
        scales = self.engine.host.get(f"blk.{layer}.ffn_down_exps.scale")
        if scales is not None:
            weights = weights * scales[chosen]
        return chosen, weights.astype(np.float32)
