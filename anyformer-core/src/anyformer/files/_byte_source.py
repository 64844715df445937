"""Random access to a model file's bytes, and reading a header from one with every fault made BAD_MODEL.

The bounded header readers (GGUF, safetensors, ONNX) share this: a ``ByteSource`` is a local file,
a buffer or a Hub range request; :func:`read_header` opens a path when given one, labels messages
with the file name, and lets nothing but ``AnyformerError(BAD_MODEL)`` leave a parser.
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar, final, runtime_checkable

from anyformer.contract._errors import AnyformerError, ErrorCode

T = TypeVar("T")

# What a parser bug on hostile bytes can raise; none of it may reach the caller as itself.
_PARSER_ERRORS = (struct.error, ValueError, OverflowError, IndexError, MemoryError, RecursionError, OSError)


class HeaderFault(Exception):
    """A fault found while parsing a header; :func:`faults_as_bad_model` makes it BAD_MODEL with the file's label."""


@contextlib.contextmanager
def faults_as_bad_model(label: str, what: str, fault_prefix: str = "") -> Iterator[None]:
    """Turn a :class:`HeaderFault` or any parser error inside the block into ``AnyformerError(BAD_MODEL)``."""
    try:
        yield
    except AnyformerError:
        raise
    except HeaderFault as exc:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: {fault_prefix}{exc}") from exc
    except _PARSER_ERRORS as exc:
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"{label}: unreadable {what} ({type(exc).__name__}: {exc})", cause=exc
        ) from exc


def read_header(
    source: ByteSource | str | os.PathLike[str], name: str | None, kind: str, parse: Callable[[ByteSource], T]
) -> T:
    """Run ``parse`` on ``source`` (a path is opened as a :class:`FileByteSource`), faults made BAD_MODEL.

    ``kind`` names the format in messages (``GGUF``); ``name`` labels them (default: the file name,
    or "``kind`` file" for an unnamed source).
    """
    what = f"{kind} header"
    if isinstance(source, (str, os.PathLike)):
        label = name or os.path.basename(os.fspath(source))
        try:
            with FileByteSource(source) as file_source, faults_as_bad_model(label, what):
                return parse(file_source)
        except OSError as exc:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: cannot read the file: {exc}", cause=exc) from exc
    with faults_as_bad_model(name or getattr(source, "name", None) or f"{kind} file", what):
        return parse(source)


@runtime_checkable
class ByteSource(Protocol):
    """Random access to the bytes of one file: a local file, a buffer or a Hub range request."""

    @property
    def size(self) -> int:
        """The total size of the file in bytes."""
        ...

    def read_at(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset``; fewer only at the end of the file."""
        ...


class BytesByteSource:
    """A :class:`ByteSource` over bytes already in memory."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self._data = bytes(data)

    @property
    def size(self) -> int:
        """The number of bytes held."""
        return len(self._data)

    def read_at(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset``."""
        if offset < 0 or length < 0:
            raise ValueError("negative offset or length")
        return self._data[offset : offset + length]


@final
class FileByteSource:
    """A :class:`ByteSource` over a local file, opened once; use it as a context manager.

    Only regular files are accepted: a FIFO or a device named like a model would block or never end.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        # O_NONBLOCK keeps open() of a FIFO from blocking; it changes nothing for regular files.
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
        fd = os.open(self.path, flags)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise AnyformerError(ErrorCode.BAD_MODEL, f"{os.path.basename(self.path)}: not a regular file")
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        self._size = st.st_size

    @property
    def size(self) -> int:
        """The file's size when it was opened."""
        return self._size

    def read_at(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset``, fewer only at the end of the file."""
        if self._fd is None:
            raise ValueError("read from a closed FileByteSource")
        if offset < 0 or length < 0:
            raise ValueError("negative offset or length")
        chunks: list[bytes] = []
        got = 0
        while got < length:
            chunk = _pread(self._fd, length - got, offset + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        """Close the file; closing twice is harmless."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FileByteSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _pread(fd: int, length: int, offset: int) -> bytes:
    # Windows has no os.pread; a seek and a read do there, as each source is used by one reader.
    if hasattr(os, "pread"):
        return os.pread(fd, length, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    return os.read(fd, length)


def read_file_prefix(path: str | os.PathLike[str], length: int) -> bytes:
    """Up to ``length`` bytes from the start of a regular file, opened as :class:`FileByteSource` opens it.

    A FIFO, a device or a folder put where a model file was (after it was checked) raises ``OSError``
    at once, rather than blocking in ``open()`` or reading for ever.
    """
    try:
        with FileByteSource(path) as source:
            return source.read_at(0, length)
    except AnyformerError as exc:
        raise OSError(exc.message) from None
