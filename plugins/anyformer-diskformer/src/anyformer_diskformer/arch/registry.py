"""The MoE families diskformer runs: one line per family, each naming its spec module.

A new family is one module under :mod:`anyformer_diskformer.arch` declaring ``SPEC``
(:class:`~anyformer_diskformer.arch.spec.ArchSpec`: its config reading, its plan's shapes, its engines)
plus one line in :data:`ARCHITECTURES`; its tiny test model goes in :mod:`~anyformer_diskformer.testing`.
``can_run``, the config reader, the plan and the load ask this module and nothing else.
"""

from __future__ import annotations

from typing import Any

from anyformer.plugin import AnyformerError, ErrorCode, GGUFHeader
from anyformer_diskformer.arch import bailingmoe, bailingmoe2, gemma4, qwen2moe, qwen3moe, qwen35moe
from anyformer_diskformer.arch.moe_config import UNREAD, MoEConfig
from anyformer_diskformer.arch.spec import ArchSpec
from anyformer_gguf_gpu.config import weights_problem

#: Every family the engines run, by GGUF architecture name.
ARCHITECTURES: dict[str, ArchSpec] = {
    spec.name: spec
    for spec in (
        qwen3moe.SPEC,
        qwen2moe.SPEC,
        bailingmoe.SPEC,
        bailingmoe2.SPEC,
        qwen35moe.SPEC,
        gemma4.SPEC,
    )
}

#: The family whose rough shape stands in for an architecture the registry does not list.
FALLBACK = "qwen3moe"


def find_spec(architecture: object) -> ArchSpec | None:
    """The spec of ``architecture``, or None where no engine runs it."""
    return ARCHITECTURES.get(architecture) if isinstance(architecture, str) else None


def moe_problem(summary: dict[str, Any]) -> str | None:
    """Why the engine cannot run a GGUF described by the core's header summary, or None."""
    arch = summary.get("architecture")
    if find_spec(arch) is None:
        return f"architecture {arch!r} is not a mixture of experts this engine reads ({', '.join(ARCHITECTURES)})"
    return weights_problem(summary, UNREAD)


def read_moe_config(header: GGUFHeader) -> MoEConfig:
    """The model's hyperparameters by its family's reader, checked against its tensors; ``BAD_MODEL`` where they
    disagree or no engine runs the family."""
    problem = moe_problem(header.summary())
    if problem is not None:
        raise AnyformerError(ErrorCode.BAD_MODEL, problem)
    return ARCHITECTURES[str(header.architecture)].read(header)
