"""``HubByteSource``: one Hub file read by HTTP range requests, a byte source for the bounded header readers.

Apart from ``_hub.py`` (describe) so that what reads headers on demand (``_gguf_facts.py``) and describe
each import it without importing each other.
"""

from __future__ import annotations

import re

import httpx2
import huggingface_hub
from huggingface_hub import constants
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._model import check_file_name
from anyformer.store._hub_errors import hub_errors

__all__ = ["HubByteSource"]


class HubByteSource:
    """Random access to one file on the Hub by HTTP range requests (a ``ByteSource`` for header readers).

    Reads are served from 1 MiB-aligned blocks, each fetched once with a ``Range`` GET on the file's
    resolve URL through huggingface_hub's shared HTTP client and headers (token, user agent, offline
    mode). At most ``max_bytes`` are fetched: a header that needs more is ``BAD_MODEL``.
    """

    #: Bytes per range request; reads are aligned to it so neighbouring reads share a request.
    block_size = 1024 * 1024

    def __init__(
        self,
        repo_id: str,
        filename: str,
        revision: str | None = None,
        *,
        size: int | None = None,
        max_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.repo_id = repo_id
        self.name = check_file_name(filename)
        self.revision = revision
        self.url = huggingface_hub.hf_hub_url(repo_id, filename, revision=revision)
        self.max_bytes = max_bytes
        #: Bytes received so far, and the number of GETs that received them.
        self.bytes_fetched = 0
        self.requests = 0
        self._headers = build_hf_headers()
        self._headers["Accept-Encoding"] = "identity"  # a compressed body would break byte offsets
        self._blocks: dict[int, bytes] = {}
        self._size = size if size is not None else self._head_size()

    @property
    def size(self) -> int:
        """The file's size in bytes, from the listing or a HEAD request."""
        return self._size

    def read_at(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset``; fewer only at the end of the file."""
        if offset < 0 or length < 0:
            raise ValueError("negative offset or length")
        end = min(self._size, offset + length)
        if offset >= end:
            return b""
        step = self.block_size
        parts = []
        for index in range(offset // step, (end - 1) // step + 1):
            block = self._block(index)
            base = index * step
            parts.append(block[max(offset, base) - base : min(end, base + step) - base])
        return b"".join(parts)

    def _head_size(self) -> int:
        with hub_errors(self.repo_id, self.revision, self.name):
            size = huggingface_hub.get_hf_file_metadata(self.url).size
        if size is None or size < 0:
            raise AnyformerError(ErrorCode.DOWNLOAD_FAILED, f"the Hub gave no size for {self.name} of {self.repo_id}")
        return size

    def _block(self, index: int) -> bytes:
        block = self._blocks.get(index)
        if block is not None:
            return block
        start = index * self.block_size
        stop = min(self._size, start + self.block_size)
        if self.bytes_fetched + (stop - start) > self.max_bytes:
            raise AnyformerError(
                ErrorCode.BAD_MODEL,
                f"{self.name}: the header runs past {self.max_bytes // 2**20} MiB; refusing to read more of it",
            )
        self._fetch(start, stop)
        return self._blocks[index]

    def _fetch(self, start: int, stop: int) -> None:
        headers = {**self._headers, "Range": f"bytes={start}-{stop - 1}"}
        with hub_errors(self.repo_id, self.revision, self.name):
            self.requests += 1
            with get_session().stream("GET", self.url, headers=headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as r:
                hf_raise_for_status(r)
                if r.status_code == 206:
                    first = _content_range_start(r.headers.get("Content-Range"))
                    if first != start:
                        raise AnyformerError(
                            ErrorCode.DOWNLOAD_FAILED,
                            f"{self.name}: asked the Hub for bytes from {start}, got a range starting at {first}",
                        )
                    body_start = start
                elif r.status_code == 200:
                    # The server ignored Range: read the body from 0 only as far as needed, then hang up.
                    body_start = 0
                else:
                    raise AnyformerError(
                        ErrorCode.DOWNLOAD_FAILED, f"{self.name}: unexpected HTTP {r.status_code} to a range request"
                    )
                data = _read_up_to(r, stop - body_start)
        self.bytes_fetched += len(data)
        if len(data) < stop - body_start:
            raise AnyformerError(
                ErrorCode.DOWNLOAD_FAILED,
                f"{self.name}: the Hub sent {len(data)} bytes for a range of {stop - body_start}",
            )
        step = self.block_size
        for base in range(body_start, stop, step):
            self._blocks[base // step] = data[base - body_start : min(stop, base + step) - body_start]


def _content_range_start(value: str | None) -> int | None:
    match = re.match(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", value or "")
    return int(match.group(1)) if match else None


def _read_up_to(response: httpx2.Response, limit: int) -> bytes:
    buf = bytearray()
    for chunk in response.iter_bytes():
        buf += chunk
        if len(buf) >= limit:
            break
    return bytes(buf[:limit])
