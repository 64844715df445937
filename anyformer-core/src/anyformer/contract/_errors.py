"""The error every public entry point raises, and its closed set of codes (docs/contract.md, "Errors")."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Protocol


class VerdictRecord(Protocol):
    """What an error keeps of each backend's verdict (:class:`anyformer.Verdict` is one).

    A protocol rather than the class itself, so that this module imports nothing from the verdict
    module, which raises these errors.
    """

    @property
    def backend(self) -> str:
        """The backend's id."""

    @property
    def ok(self) -> bool:
        """True when the backend can run the model."""

    @property
    def code(self) -> str | None:
        """The refusal code (a :class:`anyformer.Refusal`), or None when ok."""

    @property
    def reason(self) -> str:
        """The one-line reason of a refusal."""

    @property
    def need(self) -> int | None:
        """The bytes that would have been enough, on ``budget`` and ``memory`` refusals."""

    def to_dict(self) -> dict[str, Any]:
        """The verdict as JSON-ready data."""


class ErrorCode(str, enum.Enum):
    """Why an anyformer call failed. A closed enum: the values are stable strings."""

    #: No installed backend can run the model; ``verdicts`` says why each refused.
    NO_BACKEND = "NO_BACKEND"
    #: Every backend refused on the accelerator budget; ``need`` is the smallest budget that would do.
    BUDGET_TOO_SMALL = "BUDGET_TOO_SMALL"
    #: The model reference names nothing: no such repo, folder, file or revision.
    MODEL_NOT_FOUND = "MODEL_NOT_FOUND"
    #: A model file is corrupt, truncated or hostile; the message names the fault.
    BAD_MODEL = "BAD_MODEL"
    #: The weights are in a format that runs code when loaded (pickle); they are never loaded.
    UNSAFE_FORMAT = "UNSAFE_FORMAT"
    #: A download failed after its retries, or its bytes did not match the Hub's size or hash.
    DOWNLOAD_FAILED = "DOWNLOAD_FAILED"
    #: The disk holding the store has no room for the files.
    DISK_FULL = "DISK_FULL"
    #: The network is off (``HF_HUB_OFFLINE=1`` or unreachable) and the files are not cached.
    OFFLINE = "OFFLINE"
    #: The loaded model is already generating and this call did not wait.
    BUSY = "BUSY"
    #: The request is malformed: messages, options or arguments.
    BAD_REQUEST = "BAD_REQUEST"
    #: The caller cancelled the work.
    CANCELLED = "CANCELLED"
    #: The engine could not allocate memory for the model.
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    #: An isolated engine process died (abort, segfault, OOM kill).
    BACKEND_CRASHED = "BACKEND_CRASHED"
    #: A plugin failed to import, is invalid, or broke its hook contract.
    PLUGIN_ERROR = "PLUGIN_ERROR"

    def __str__(self) -> str:
        return self.value


class AnyformerError(Exception):
    """An error with a code from :class:`ErrorCode` and a one-line message for people.

    ``need`` carries the bytes that would have sufficed (``BUDGET_TOO_SMALL``), ``verdicts``
    every backend's answer (``NO_BACKEND``, ``BUDGET_TOO_SMALL``), and ``__cause__`` the library
    exception this one wraps.
    """

    def __init__(
        self,
        code: ErrorCode | str,
        message: str,
        *,
        need: int | None = None,
        verdicts: Sequence[VerdictRecord] | None = None,
        cause: BaseException | None = None,
    ) -> None:
        self.code = ErrorCode(code)
        self.message = " ".join(str(message).split())
        self.need = need
        self.verdicts = list(verdicts) if verdicts is not None else None
        super().__init__(f"{self.code.value}: {self.message}")
        if cause is not None:
            self.__cause__ = cause

    def to_dict(self) -> dict[str, Any]:
        """The error as JSON-ready data: code, message, need and verdicts."""
        return {
            "code": self.code.value,
            "message": self.message,
            "need": self.need,
            "verdicts": [v.to_dict() for v in self.verdicts] if self.verdicts is not None else None,
        }
