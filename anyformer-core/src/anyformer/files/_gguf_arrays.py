"""GGUF metadata arrays kept as their validated bytes and decoded only when asked for.

A model description needs a vocabulary's length, not its 49k strings: building those Python
objects was most of the time ``describe`` spent on a GGUF. The header reader checks every bound and
every element's UTF-8 before it builds a :class:`LazyArray`, so decoding later cannot fail on a
hostile file; it only builds the list (once, then kept).

UTF-8 is checked for a whole string array at once: when every length is under 128, the eight bytes
of each length prefix are ASCII, and ASCII bytes can neither start nor end inside a multibyte
sequence, so the array's bytes decode as UTF-8 exactly when each element does. Elements of 128
bytes or more (their prefix is not ASCII) are decoded on their own, and so is the text between them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any, overload

_U64 = struct.Struct("<Q")
#: An element this long or longer has a length prefix that is not all ASCII.
ASCII_PREFIX_LIMIT = 128


class LazyArray(Sequence[Any]):
    """A GGUF array whose elements are decoded from its bytes on first use; compares equal to a list."""

    __slots__ = ("_count", "_decoded", "_format", "_offset", "_raw", "_strings")

    def __init__(self, raw: bytes, count: int, element_format: str, offset: int = -1) -> None:
        """``raw``: the array's bytes after its count; ``element_format``: a struct code, or "" for strings;
        ``offset``: where ``raw`` begins in the file (-1 when unknown)."""
        self._raw = raw
        self._count = count
        self._format = element_format
        self._offset = offset
        self._decoded: list[Any] | None = None
        self._strings: list[bytes] | None = None

    @property
    def is_strings(self) -> bool:
        """True for an array of strings."""
        return not self._format

    def to_list(self) -> list[Any]:
        """The elements as a list (decoded once, then the same list)."""
        if self._decoded is None:
            if self._format:
                self._decoded = list(struct.unpack_from(f"<{self._count}{self._format}", self._raw))
            else:
                items = self._strings if self._strings is not None else self._cut_strings()
                self._decoded = [item.decode("utf-8") for item in items]
        return self._decoded

    def raw_strings(self) -> list[bytes]:
        """The elements of a string array as bytes, without decoding them (they are valid UTF-8).

        Cut once, then the same list, not to be modified (a backend's checks and its loader may each ask).
        """
        if self._format:
            raise TypeError("raw_strings() is for arrays of strings")
        if self._strings is None:
            self._strings = self._cut_strings()
        return self._strings

    def shared_state(self) -> tuple[int, int, int, str]:
        """Where its bytes lie in the file (offset, or -1, and length), the element count and the struct
        code ("" for strings): what rebuilds it from the same file."""
        return self._offset, len(self._raw), self._count, self._format

    def _cut_strings(self) -> list[bytes]:
        raw, unpack = self._raw, _U64.unpack_from
        out: list[bytes] = [b""] * self._count
        pos = 0
        for index in range(self._count):
            (n,) = unpack(raw, pos)
            first = pos + 8
            pos = first + n
            out[index] = raw[first:pos]
        return out

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        return self.to_list()[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.to_list())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyArray):
            return self.to_list() == other.to_list()
        if isinstance(other, (list, tuple)):
            return self.to_list() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-list semantics, as the list it stands for

    def __repr__(self) -> str:
        kind = "strings" if not self._format else self._format
        return f"<LazyArray of {self._count} {kind}>"


def has_invalid_utf8(raw: bytes, long_prefixes: Sequence[int]) -> bool:
    """True when some element of the string array ``raw`` is not valid UTF-8.

    ``long_prefixes`` are the offsets in ``raw`` of the length prefixes of elements of
    :data:`ASCII_PREFIX_LIMIT` bytes or more, in order; everything between them is checked in one
    decode (see the module docstring).
    """
    start = 0
    try:
        for prefix in long_prefixes:
            raw[start:prefix].decode("utf-8")
            n = _U64.unpack_from(raw, prefix)[0]
            content = prefix + 8
            raw[content : content + n].decode("utf-8")
            start = content + n
        raw[start:].decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False
