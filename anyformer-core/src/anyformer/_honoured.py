"""The rule that no option which would change a reply is dropped: what a handle does not honour is refused.

``Loaded.generate`` calls :func:`refuse_unhonoured` after the options are checked and before any
work, with the names the handle declared (``Features.honours``, :mod:`anyformer.contract._features`).
"""

from __future__ import annotations

from collections.abc import Set

from anyformer.contract._chunk import GenerateOptions
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._sampling import SAMPLING_OPTIONS


def requested(options: GenerateOptions) -> list[str]:
    """The optional options a call asks for, by the names ``honours`` lists, in a stable order."""
    names = [name for name in SAMPLING_OPTIONS if name in options.extra]
    if options.logprobs is not None and options.prompt is None:
        names.append("logprobs")  # a raw prompt's logprobs go with raw_text, as they always have
    if options.constraint is not None:
        names.append("constraint")
    if options.tools:
        names.append("tools")
    if options.template_variables:
        names.append("template_variables")
    return names


def refuse_unhonoured(backend: str, honours: Set[str], options: GenerateOptions) -> None:
    """Raise ``BAD_REQUEST`` naming every requested option ``honours`` lacks; the message starts with the first."""
    missing = [name for name in requested(options) if name not in honours]
    if missing:
        raise AnyformerError(
            ErrorCode.BAD_REQUEST,
            f"{', '.join(missing)}: not honoured by {backend}, so refused rather than ignored; "
            "leave them out or load the model on a backend that honours them",
        )
