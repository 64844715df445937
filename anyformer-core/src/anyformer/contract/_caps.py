"""What this machine can do (docs/contract.md, "Capabilities"): the GPU adapter, host memory and the model store.

The record only: ``anyformer.machine`` probes the machine and fills it in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode

#: The capability flags ``--caps`` may name.
CAP_FLAGS = ("gpu", "f16", "subgroups", "store")


@dataclasses.dataclass(frozen=True)
class Caps:
    """The machine's capabilities, as the backends see them. Every field can be overridden."""

    gpu: bool = False
    gpu_name: str | None = None
    gpu_type: str | None = None
    f16: bool = False
    subgroups: bool = False
    #: Free accelerator memory now, None where no source knows it (never 0 for "unknown").
    gpu_bytes: int | None = None
    #: The accelerator's total memory (Metal: its recommended working set), None where unknown.
    gpu_total_bytes: int | None = None
    #: What told the GPU memory: ``nvml``, ``nvidia-smi``, ``amd-smi``, ``rocm-smi``, ``metal``, ``vulkan``,
    #: ``host`` (a software adapter counted as a GPU) or None.
    gpu_memory_source: str | None = None
    gpu_limits: dict[str, int] = dataclasses.field(default_factory=dict)
    ram_bytes: int = 0
    store: bool = False
    store_path: str | None = None
    disk_free_bytes: int | None = None
    cpu_count: int = 1
    #: Why the GPU fields are what they are (no wgpu, a software adapter, an override…).
    gpu_note: str = ""

    def replace(self, **changes: Any) -> Caps:
        """A copy with some fields changed: the what-if question."""
        return dataclasses.replace(self, **changes)

    def with_flags(self, flags: Iterable[str]) -> Caps:
        """A copy where the boolean capabilities are exactly ``flags`` (``gpu,f16,subgroups,store``)."""
        wanted = {f.strip().lower() for f in flags if f.strip()}
        unknown = wanted - set(CAP_FLAGS)
        if unknown:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"unknown capability {', '.join(sorted(unknown))}; choose from {', '.join(CAP_FLAGS)}",
            )
        return self.replace(
            gpu="gpu" in wanted,
            f16="f16" in wanted,
            subgroups="subgroups" in wanted,
            store="store" in wanted,
            gpu_note="set by --caps",
        )

    def to_dict(self) -> dict[str, Any]:
        """The capabilities as JSON-ready data."""
        return dataclasses.asdict(self)
