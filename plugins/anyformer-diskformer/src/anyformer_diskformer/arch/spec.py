"""What diskformer knows of one MoE family: how its config is read, how the plan sizes it, which engines run it.

Each family's module (:mod:`~anyformer_diskformer.arch.qwen3moe`, …) declares one :class:`ArchSpec`;
:mod:`~anyformer_diskformer.arch.registry` lists them. The engines are named by functions that import
them when called, so reading a spec (``can_run``, the plan) imports neither numpy's engines nor wgpu.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from anyformer.plugin import GGUFHeader
from anyformer_diskformer.arch.moe_config import HeaderReading, MoEConfig, read_common_config

if TYPE_CHECKING:
    from anyformer_diskformer.engines.cpu.moe import CpuMoEEngine
    from anyformer_diskformer.engines.gpu.moe import GpuMoEEngine


@dataclasses.dataclass(frozen=True)
class RoughShape:
    """What an architecture's released models look like, for a plan without a header (a rough estimate)."""

    layers: int
    experts: int
    used: int
    #: The share of the file that is not routed experts (embeddings, attention, norms, shared experts).
    dense_share: float
    #: Key plus value width per attention layer, and the share of layers' context it spans.
    kv_width: int
    kv_share: float


def moe_cpu_engine() -> type[CpuMoEEngine]:
    """The numpy MoE engine (every family whose layers are attention and routed experts)."""
    from anyformer_diskformer.engines.cpu.moe import CpuMoEEngine

    return CpuMoEEngine


def moe_gpu_engine() -> type[GpuMoEEngine]:
    """The wgpu MoE engine (every family whose layers are attention and routed experts)."""
    from anyformer_diskformer.engines.gpu.moe import GpuMoEEngine

    return GpuMoEEngine


#: Bytes of a family's state, or of its GPU prompt steps, from its config, the context and the step's tokens.
ConfigBytes = Callable[[MoEConfig, int, int], int]
#: Floats a token's row of the GPU prompt steps adds for a family's own layers (summary, n_embd, q width).
RowFloats = Callable[[dict[str, Any], int, int], int]


@dataclasses.dataclass(frozen=True)
class ArchSpec:
    """One MoE family (a GGUF ``general.architecture``) as diskformer runs it."""

    #: The GGUF architecture name.
    name: str
    #: How the common config reader reads its header (ignored where :attr:`read_config` is its own reader).
    reading: HeaderReading
    #: The released models' shape, for a plan without a header.
    rough_shape: RoughShape
    #: The engines that run it.
    cpu_engine: Callable[[], type[CpuMoEEngine]] = moe_cpu_engine
    gpu_engine: Callable[[], type[GpuMoEEngine]] = moe_gpu_engine
    #: Its whole config reader, where the common one does not read it (Gemma 4); None: the common reader.
    read_config: Callable[[GGUFHeader], MoEConfig] | None = None
    #: Its KV (and recurrent) state when it is not one width for every layer; None: the summary's uniform KV.
    state_bytes: ConfigBytes | None = None
    #: Its GPU prompt steps' exact bytes; None: the summary's estimate
    #: (:func:`~anyformer_diskformer.plan.prompt_step_bytes`).
    prompt_bytes: ConfigBytes | None = None
    #: What its own layers add to that estimate's row; None: nothing.
    prompt_row_floats: RowFloats | None = None

    @property
    def per_layer_state(self) -> bool:
        """Whether its state is sized per layer from the header's keys (which the summary does not carry)."""
        return self.state_bytes is not None

    def read(self, header: GGUFHeader) -> MoEConfig:
        """The model's hyperparameters, checked against its tensors; ``BAD_MODEL`` where they disagree."""
        if self.read_config is not None:
            return self.read_config(header)
        return read_common_config(header, self.reading)
