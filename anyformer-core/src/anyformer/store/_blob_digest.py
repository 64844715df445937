"""The digest a downloaded blob must have, computed while the bytes arrive.

An LFS file is checked against its sha256 (the Hub's listing and ETag), a regular file against its
git blob sha1 (the ETag of a file kept in git). Hashing runs in a thread of its own, fed the chunks
as they are written, so verifying costs no time on top of the transfer where a core is free
(hashlib releases the GIL on large buffers).
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Chunks waiting to be hashed; bounds the memory a slow hash can hold.
_QUEUE_CHUNKS = 256
_STOP = None


class BlobDigest:
    """A sha256 or git-blob-sha1 digest fed from a background thread.

    ``algorithm`` is ``sha256`` or ``git-sha1``; a git blob sha1 hashes ``blob <size>\\0`` first,
    so it needs the file's ``size`` up front.
    """

    def __init__(self, algorithm: str, size: int | None = None) -> None:
        if algorithm == "git-sha1":
            if size is None:
                raise ValueError("a git blob sha1 needs the size first")
            factory: Callable[[], Any] = hashlib.sha1
            prefix = b"blob %d\x00" % size
        elif algorithm == "sha256":
            factory, prefix = hashlib.sha256, b""
        else:
            raise ValueError(f"unknown digest {algorithm!r}")
        self.algorithm = algorithm
        self._hash = factory()
        if prefix:
            self._hash.update(prefix)
        #: Bytes fed so far (the prefix not counted).
        self.count = 0
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=_QUEUE_CHUNKS)
        self._thread = threading.Thread(target=self._run, name="anyformer-digest", daemon=True)
        self._thread.start()
        self._closed = False

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not _STOP:
            self._hash.update(chunk)

    def update(self, chunk: bytes) -> None:
        """Hash ``chunk`` after the bytes fed before it."""
        self._queue.put(chunk)
        self.count += len(chunk)

    def update_from_file(self, path: Path, length: int, block: int = 8 * 1024 * 1024) -> None:
        """Hash the first ``length`` bytes of ``path`` (a partial download being resumed)."""
        with path.open("rb") as f:
            left = length
            while left > 0:
                data = f.read(min(block, left))
                if not data:
                    raise OSError(f"{path} is shorter than {length} bytes")
                self.update(data)
                left -= len(data)

    def hexdigest(self) -> str:
        """Wait for every chunk to be hashed and return the digest."""
        self.close()
        return self._hash.hexdigest()

    def close(self) -> None:
        """Stop the hashing thread (idempotent)."""
        if not self._closed:
            self._closed = True
            self._queue.put(_STOP)
            self._thread.join()
