"""Refusal codes and verdicts: each backend's answer to "can you run this model here?" (docs/contract.md)."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode


class Refusal(str, enum.Enum):
    """Why a backend cannot run a model. A closed enum: the values are stable strings."""

    #: The repo has no file in a format this backend reads.
    FORMAT = "format"
    #: The requested task is not one this backend runs.
    TASK = "task"
    #: Right format, but no engine of this backend reads this model (architecture, quant, tags).
    MODEL = "model"
    #: Needs a hardware GPU adapter and there is none.
    GPU = "gpu"
    #: Needs shader-f16 and the GPU lacks it.
    F16 = "f16"
    #: Needs subgroup operations and the GPU lacks them.
    SUBGROUPS = "subgroups"
    #: Needs a writable model store with room for the files, and there is none.
    STORE = "store"
    #: Would not fit the accelerator budget; ``need`` is the smallest budget that would.
    BUDGET = "budget"
    #: Would not fit host memory; ``need`` is the host memory it would take.
    MEMORY = "memory"
    #: The backend's library is missing or broken; the reason says how to fix it.
    RUNTIME = "runtime"
    #: The request gives a load option this backend does not declare (another installed backend does).
    OPTION = "option"

    def __str__(self) -> str:
        return self.value


#: The refusals that must carry ``need``: the bytes that would have been enough.
NEED_REFUSALS = frozenset({Refusal.BUDGET, Refusal.MEMORY})


class Rank(enum.IntEnum):
    """How closely a backend's engine fits the model; the selection policy prefers lower ranks."""

    #: An engine written for this model or architecture (hand-written kernels, a dedicated runtime).
    SPECIALIST = 0
    #: A general engine for a format (an ONNX runtime).
    GENERAL = 1
    #: A general engine kept as the last resort (llama.cpp runs almost any GGUF).
    FALLBACK = 2


@dataclasses.dataclass(frozen=True)
class Estimate:
    """What running the model would take: accelerator bytes, host bytes, disk bytes, decode speed."""

    gpu_bytes: int = 0
    ram_bytes: int = 0
    disk_bytes: int = 0
    tok_per_sec: float | None = None
    #: Where this backend stands in the selection order (docs/contract.md, "Selection").
    rank: Rank = Rank.GENERAL
    #: Backend-specific facts worth showing (e.g. the file chosen, layers offloaded).
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The repo files a load would read (``anyformer pull`` fetches these); empty: not said.
    files: tuple[str, ...] = ()
    #: The content blocks besides text this load reads (``"image"``, ``"audio"``); ``()``: text only;
    #: None: not said. A chat with blocks the chosen load does not read is ``BAD_REQUEST`` naming the
    #: backends whose estimates read them.
    inputs: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The estimate as JSON-ready data (``files`` only when the backend named them)."""
        data: dict[str, Any] = {
            "gpu_bytes": self.gpu_bytes,
            "ram_bytes": self.ram_bytes,
            "disk_bytes": self.disk_bytes,
            "tok_per_sec": self.tok_per_sec,
            "rank": Rank(self.rank).name.lower(),
        }
        if self.details:
            data["details"] = dict(self.details)
        if self.files:
            data["files"] = list(self.files)
        if self.inputs is not None:
            data["inputs"] = list(self.inputs)
        return data


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One backend's answer: ``ok`` with an estimate, or a refusal ``code`` with a one-line ``reason``."""

    backend: str
    ok: bool
    code: Refusal | None = None
    reason: str = ""
    need: int | None = None
    estimate: Estimate | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.backend, str) or not self.backend:
            raise AnyformerError(ErrorCode.PLUGIN_ERROR, f"a verdict needs a backend id, got {self.backend!r}")
        if self.ok:
            if self.need is not None:
                raise AnyformerError(ErrorCode.PLUGIN_ERROR, f"{self.backend}: an ok verdict carries no need")
            if self.code is not None:
                raise AnyformerError(ErrorCode.PLUGIN_ERROR, f"{self.backend}: an ok verdict has no refusal code")
            if self.estimate is None:
                object.__setattr__(self, "estimate", Estimate())
            return
        try:
            code = Refusal(self.code)
        except ValueError:
            raise AnyformerError(
                ErrorCode.PLUGIN_ERROR, f"{self.backend}: unknown refusal code {self.code!r}"
            ) from None
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "reason", " ".join(str(self.reason).split()) or code.value)
        if code in NEED_REFUSALS and (self.need is None or self.need <= 0):
            raise AnyformerError(ErrorCode.PLUGIN_ERROR, f"{self.backend}: a '{code}' refusal must carry need > 0")
        if code not in NEED_REFUSALS and self.need is not None:
            raise AnyformerError(ErrorCode.PLUGIN_ERROR, f"{self.backend}: only budget and memory refusals carry need")

    @classmethod
    def accept(cls, backend: str, estimate: Estimate | None = None) -> Verdict:
        """An ok verdict."""
        return cls(backend=backend, ok=True, estimate=estimate or Estimate())

    @classmethod
    def refuse(cls, backend: str, code: Refusal | str, reason: str, need: int | None = None) -> Verdict:
        """A refusal with its code, a one-line reason and, for budget or memory, the need."""
        return cls(backend=backend, ok=False, code=code, reason=reason, need=need)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        """The verdict as the JSON of docs/contract.md ("Verdicts")."""
        if self.ok:
            assert self.estimate is not None
            return {"backend": self.backend, "ok": True, "estimate": self.estimate.to_dict()}
        assert self.code is not None
        return {"backend": self.backend, "ok": False, "code": self.code.value, "reason": self.reason, "need": self.need}
