"""Byte sizes as people write them: ``4GB``, ``512MB``, ``1.5GiB``, ``0``."""

from __future__ import annotations

import re

from anyformer.contract._errors import AnyformerError, ErrorCode

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
# More digits than any real size has; longer input is refused before int() sees it.
_MAX_DIGITS = 40
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse a size in bytes. Decimal units (``GB`` = 10^9) as disks are sold; ``GiB`` binary.

    Raises ``AnyformerError(BAD_REQUEST)`` for negative, empty or unknown sizes.
    """
    if isinstance(text, bool):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"a size cannot be negative: {text}")
        return text
    match = _SIZE.match(str(text))
    if not match:
        if str(text).strip().startswith("-"):
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"a size cannot be negative: {text!r}")
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"not a size: {text!r} (write 4GB, 512MB or 0)")
    number, unit = match.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise AnyformerError(
            ErrorCode.BAD_REQUEST, f"unknown unit {unit!r} in {text!r} (use B, KB, MB, GB, TB or KiB…TiB)"
        )
    if len(number) > _MAX_DIGITS:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"not a size: a number {len(number)} digits long")
    # Exact integer arithmetic: a float would turn a long number into inf and 4.1GB into 4099999999.
    whole, _, fraction = number.partition(".")
    return int(whole) * factor + (int(fraction) * factor // 10 ** len(fraction) if fraction else 0)


def format_size(n: int | None) -> str:
    """A size for people, in decimal units with three significant digits: ``1.23 GB``."""
    if n is None:
        return "?"
    for unit, factor in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if abs(n) >= factor:
            return f"{n / factor:.3g} {unit}"
    return f"{n} B"
