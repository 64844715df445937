"""Which installed backends would put a model on this machine's GPU (``anyformer caps``).

There is no hook for "do you use the GPU": each backend is asked what it always answers, ``can_run``,
about the embedded default model (SmolLM2-135M, a GGUF), and an accepting verdict that puts bytes
on the GPU is a backend that uses it. A backend that cannot run that model says why (a backend for
ONNX files refuses a GGUF), so the list names what was asked, not a guess.
"""

from __future__ import annotations

import dataclasses

from anyformer.contract._caps import Caps
from anyformer.contract._errors import AnyformerError


@dataclasses.dataclass(frozen=True)
class GpuUse:
    """One backend's answer: whether it would use the GPU for the default model, and why."""

    backend: str
    gpu: bool
    why: str


def has_gpu(caps: Caps) -> bool:
    """Whether there is a GPU to ask about: a hardware adapter, or GPU memory some source reported."""
    hardware_adapter = caps.gpu and caps.gpu_type != "CPU"
    return hardware_adapter or caps.gpu_memory_source not in (None, "host")


def gpu_backends(caps: Caps) -> list[GpuUse]:
    """Every installed backend's answer for the embedded default model, or [] where it is not installed."""
    from anyformer._api import check
    from anyformer._default_model import default_model_path

    try:
        _, selection = check(default_model_path(), caps=caps)
    except AnyformerError:
        return []
    answers = []
    for verdict in sorted(selection.verdicts, key=lambda v: v.backend):
        estimate = verdict.estimate
        if not verdict.ok or estimate is None:
            answers.append(GpuUse(verdict.backend, False, f"cannot run it: {verdict.code} ({verdict.reason})"))
            continue
        details = estimate.details
        placement = details.get("placement")
        note = details.get("note")
        on_gpu = bool(estimate.gpu_bytes)
        why = str(note or placement or ("on the GPU" if on_gpu else "on the CPU"))
        answers.append(GpuUse(verdict.backend, on_gpu, why))
    return answers
