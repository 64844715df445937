"""What a loaded model can do beyond plain chat: one frozen record, declared by its handle.

A handle (:class:`anyformer.plugin.BackendModel`) sets ``features``; the core reads it once after
``load`` (:func:`checked_features`) and from then on only the record, in this process or, for an
isolated worker, as the one ``features`` field of the worker's ``loaded`` frame.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._sampling import FEATURES, SAMPLING_OPTIONS


@dataclasses.dataclass(frozen=True)
class Features:
    """A handle's capabilities; each default is what the core assumes of a handle that declares nothing.

    Every capability here widens what the core lets through to the handle: a call that needs one the
    handle lacks is refused with ``BAD_REQUEST`` before the backend sees it.
    """

    #: ``generate`` continues ``options.prompt`` as written, with no chat template (a raw completion).
    raw_text: bool = False
    #: With ``raw_text``: ``options.prompt_logprobs`` scores the prompt's own tokens on the first chunk.
    prompt_logprobs: bool = False
    #: ``generate`` reads audio blocks in chat messages.
    audio_input: bool = False
    #: How many streams (and ``run`` calls) the handle serves at once; ``generate`` and ``run`` are then
    #: called from that many threads. 1: one at a time.
    parallel: int = 1
    #: ``run`` takes the core's ``progress`` callable, reports each unit of work and lets the
    #: ``CANCELLED`` it raises propagate (the core then always passes ``progress=``).
    run_progress: bool = False
    #: The optional generate options honoured: sampling options (``min_p``, ``logit_bias``…) and the
    #: features ``logprobs`` (chats), ``constraint``, ``tools``, ``template_variables``.
    honours: frozenset[str] = frozenset()
    #: The handle runs a non-generation task through ``run``. The core sets it from whether the handle's
    #: class overrides ``BackendModel.run``; leave it out.
    run: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready data (``honours`` sorted)."""
        return {**dataclasses.asdict(self), "honours": sorted(self.honours)}

    @classmethod
    def from_dict(cls, data: Any) -> Features:
        """The record :meth:`to_dict` wrote; ``BAD_REQUEST`` naming the first field that is not one."""
        if not isinstance(data, Mapping):
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"features must be a mapping, not {type(data).__name__}")
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"unknown features field {unknown[0]!r}")
        honours = data.get("honours", ())
        if isinstance(honours, (str, bytes)) or not isinstance(honours, (list, tuple, set, frozenset)):
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"features.honours must be a list of names, got {honours!r:.60}"
            )
        return cls(**{**data, "honours": frozenset(honours)}).checked()

    def checked(self) -> Features:
        """This record when every field has its type and the names in ``honours`` are known; else ``BAD_REQUEST``."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "parallel":
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise AnyformerError(
                        ErrorCode.BAD_REQUEST, f"features.parallel must be a positive int, got {value!r:.40}"
                    )
            elif field.name == "honours":
                strange = sorted(repr(name) for name in value if name not in SAMPLING_OPTIONS and name not in FEATURES)
                if strange:
                    known = ", ".join([*SAMPLING_OPTIONS, *FEATURES])
                    raise AnyformerError(
                        ErrorCode.BAD_REQUEST, f"features.honours names {strange[0]}, not one of {known}"
                    )
            elif not isinstance(value, bool):
                raise AnyformerError(
                    ErrorCode.BAD_REQUEST, f"features.{field.name} must be True or False, got {value!r:.40}"
                )
        if self.prompt_logprobs and not self.raw_text:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, "features.prompt_logprobs needs raw_text: it scores raw prompts"
            )
        if self.run_progress and not self.run:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "features.run_progress needs a handle that overrides run()")
        return self
