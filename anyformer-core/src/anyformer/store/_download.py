"""One file from the Hub into huggingface_hub's cache, verified and resumable (SAFETY D1–D7).

huggingface_hub 2.x checks only a download's size and restarts a cut one from zero, so the transfer
is ours, on huggingface_hub's HTTP client, headers, URLs and metadata:

- the bytes stream into ``blobs/<etag>.incomplete`` while holding ``.locks/…/<etag>.lock`` (the
  lock huggingface_hub takes too): a second process waits, then finds the blob and only links it;
- a kept ``.incomplete`` is resumed with ``Range``; a server that answers 200 instead of 206 is
  restarted from zero, truncating first, so no byte is written twice;
- dropped connections are retried a bounded number of times with backoff (the count starts again
  whenever bytes arrive), then ``DOWNLOAD_FAILED`` with the partial file kept for the next run;
- a body longer or shorter than the size the Hub announced, or bytes whose sha256 (LFS) or git
  blob sha1 (regular file) differ from the Hub's, are ``DOWNLOAD_FAILED`` and the partial file is
  deleted; a full disk is ``DISK_FULL`` with the partial file deleted;
- only verified bytes are renamed to ``blobs/<etag>``, then linked from the snapshot: a final name
  never holds a partial or unverified file (the store writes the ref once every file is in).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._model import check_file_name
from anyformer.store._blob_digest import BlobDigest
from anyformer.store._cache_layout import COMMIT, RepoCache

#: Seconds to wait before each retry of a transfer that made no progress; its length bounds the retries.
BACKOFF_SECONDS: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)
#: Least time between two progress reports of one file.
PROGRESS_INTERVAL_SECONDS = 0.1
_SHA256 = re.compile(r"^[0-9a-f]{64}\Z")
_SHA1 = re.compile(r"^[0-9a-f]{40}\Z")
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*\Z")
_FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
# Statuses worth asking again for: the server is busy or briefly broken.
_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})

#: Receives (bytes done, bytes in all) of one file.
ByteProgress = Callable[[int, "int | None"], None]


@dataclasses.dataclass(frozen=True)
class HubFile:
    """A file to fetch: repo, the commit (or revision) it is read at, its name, and what the listing says."""

    repo_id: str
    revision: str
    name: str
    size: int | None = None
    sha256: str | None = None


@dataclasses.dataclass(frozen=True)
class _Remote:
    """What the Hub's HEAD says about a file: where to GET it, its ETag, commit and size."""

    url: str
    location: str
    etag: str
    commit: str
    size: int | None


class _Failed(Exception):
    """A transfer attempt failed in a way worth retrying (a dropped connection, a 5xx)."""


def download(file: HubFile, progress: ByteProgress | None = None) -> Path:
    """Fetch one Hub file into the cache, verified; return its snapshot path (a link to the blob)."""
    from anyformer.store._hub_errors import hub_errors  # imports huggingface_hub: only when downloading

    check_file_name(file.name)
    cache = RepoCache.of(file.repo_id)
    if COMMIT.match(file.revision):
        cached = cache.cached_file(file.revision, file.name)
        if cached is not None and (file.size is None or cached.stat().st_size == file.size):
            return cached
    with hub_errors(file.repo_id, file.revision, file.name):
        remote = _head(file)
        algorithm, digest = _expected_digest(file, remote)
        size = file.size if file.size is not None else remote.size
        if file.size is not None and remote.size is not None and file.size != remote.size:
            raise AnyformerError(
                ErrorCode.DOWNLOAD_FAILED,
                f"{file.name}: the Hub's listing says {file.size} bytes and its HEAD {remote.size}",
            )
        blob = cache.blob(remote.etag)
        lock_path = cache.lock(remote.etag)
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        cache.blobs.mkdir(parents=True, exist_ok=True)
        with _locked(lock_path) as locked_at:
            if not _usable_blob(blob, size):
                _clean_orphans(cache, remote.etag, locked_at)
                _Transfer(file, remote, cache, size, algorithm, digest, progress).run()
            cache.link(remote.commit, file.name, remote.etag)
    return cache.pointer(remote.commit, file.name)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[float]:
    import filelock

    lock = filelock.FileLock(str(path), mode=0o664)
    with lock:
        yield time.time()


def _usable_blob(blob: Path, size: int | None) -> bool:
    """True when the blob is stored; one of the wrong size (damaged on disk) is removed and fetched again."""
    try:
        actual = blob.stat().st_size
    except OSError:
        return False
    if size is None or actual == size:
        return True
    blob.unlink(missing_ok=True)
    return False


def _head(file: HubFile) -> _Remote:
    import huggingface_hub

    url = huggingface_hub.hf_hub_url(file.repo_id, file.name, revision=file.revision)
    meta = huggingface_hub.get_hf_file_metadata(url, retry_on_errors=False)
    etag = (meta.etag or "").lower()
    if not (_SHA256.match(etag) or _SHA1.match(etag)):
        raise AnyformerError(
            ErrorCode.DOWNLOAD_FAILED,
            f"{file.name}: the Hub gave no ETag digest ({meta.etag!r}); its bytes could not be verified",
        )
    commit = (meta.commit_hash or "").lower()
    if not COMMIT.match(commit):
        raise AnyformerError(
            ErrorCode.DOWNLOAD_FAILED, f"{file.name}: the Hub gave no commit id ({meta.commit_hash!r})"
        )
    if COMMIT.match(file.revision) and commit != file.revision:
        raise AnyformerError(
            ErrorCode.DOWNLOAD_FAILED, f"{file.name}: asked for commit {file.revision}, the Hub answered for {commit}"
        )
    size = meta.size if isinstance(meta.size, int) and meta.size >= 0 else None
    # As huggingface_hub does: a Xet-stored file is fetched from its resolve URL (redirects followed),
    # anything else from where the HEAD pointed (a CDN for LFS files).
    location = url if meta.xet_file_data is not None else (meta.location or url)
    return _Remote(url=url, location=location, etag=etag, commit=commit, size=size)


def _expected_digest(file: HubFile, remote: _Remote) -> tuple[str, str]:
    """(``sha256`` or ``git-sha1``, hex digest) the bytes must hash to."""
    listed = (file.sha256 or "").lower() or None
    if listed is not None:
        if not _SHA256.match(listed):
            raise AnyformerError(
                ErrorCode.DOWNLOAD_FAILED, f"{file.name}: the listing's sha256 {listed!r} is malformed"
            )
        if _SHA256.match(remote.etag) and remote.etag != listed:
            raise AnyformerError(
                ErrorCode.DOWNLOAD_FAILED,
                f"{file.name}: the Hub's listing gives sha256 {listed} and its ETag {remote.etag}",
            )
        return "sha256", listed
    if _SHA256.match(remote.etag):
        return "sha256", remote.etag
    return "git-sha1", remote.etag


def _clean_orphans(cache: RepoCache, etag: str, locked_at: float) -> None:
    """Adopt or delete partial downloads of this blob left by killed processes.

    huggingface_hub writes ``<etag>.<random>.incomplete`` and deletes it on failure, but a killed
    process leaves it. Under the lock no one else is writing this blob, so every such file that
    predates the lock is an orphan: the largest becomes our resumable partial file when there is
    none (its bytes are verified like any other), the rest are deleted.
    """
    ours = cache.incomplete(etag)
    orphans = []
    for path in cache.blobs.glob(f"{etag}.*.incomplete"):
        with contextlib.suppress(OSError):
            stat = path.stat()
            if stat.st_mtime <= locked_at:
                orphans.append((stat.st_size, path))
    orphans.sort(reverse=True)
    if orphans and not ours.exists():
        with contextlib.suppress(OSError):
            os.replace(orphans.pop(0)[1], ours)
    for _size, path in orphans:
        with contextlib.suppress(OSError):
            path.unlink()


class _Transfer:
    """The resumable, verified GET of one blob into ``blobs/<etag>.incomplete``, then into place."""

    def __init__(
        self,
        file: HubFile,
        remote: _Remote,
        cache: RepoCache,
        size: int | None,
        algorithm: str,
        digest: str,
        progress: ByteProgress | None,
    ) -> None:
        self.file = file
        self.remote = remote
        self.cache = cache
        self.size = size
        self.algorithm = algorithm
        self.digest = digest
        self.progress = progress
        self.temp = cache.incomplete(remote.etag)
        self.blob = cache.blob(remote.etag)
        self._hash: BlobDigest | None = None
        self._last_report = 0.0

    # ---- the attempts ------------------------------------------------------------------------------

    def run(self) -> None:
        """Transfer, verify and rename into place; every failure leaves no file under the blob's name."""
        try:
            self._check_room()
            resumed = self._on_disk() > 0
            self._attempts()
            try:
                self._verify()
            except AnyformerError:
                if not resumed:
                    raise
                # The kept partial bytes may be what was wrong (another process's, a damaged disk):
                # they are gone now (``_bad``), so one more transfer from byte 0 decides.
                self._attempts()
                self._verify()
            os.replace(self.temp, self.blob)
        except OSError as exc:
            if exc.errno in _FULL_DISK:
                self._discard()
                raise self._disk_full(exc) from exc
            raise
        finally:
            if self._hash is not None:
                self._hash.close()

    def _attempts(self) -> None:
        retries = 0
        while True:
            before = self._on_disk()
            try:
                self._attempt()
                return
            except _Failed as failure:
                if self._on_disk() > before:
                    retries = 0  # bytes arrived: a new run of tries
                if retries >= len(BACKOFF_SECONDS):
                    if self._on_disk() == 0:
                        self._discard()  # nothing worth resuming
                    raise AnyformerError(
                        ErrorCode.DOWNLOAD_FAILED,
                        f"{self.file.name}: {failure} (gave up after {retries + 1} tries with no progress; "
                        f"{self._on_disk()} of {self.size or '?'} bytes are kept to resume on the next pull)",
                        cause=failure.__cause__,
                    ) from failure
                time.sleep(BACKOFF_SECONDS[retries])
                retries += 1

    def _on_disk(self) -> int:
        try:
            return self.temp.stat().st_size
        except OSError:
            return 0

    def _attempt(self) -> None:
        import httpx2
        from huggingface_hub import constants
        from huggingface_hub.utils import build_hf_headers, get_session

        offset = self._on_disk()
        if self.size is not None and offset > self.size:
            self._truncate()  # a partial file longer than the blob: not ours to trust
            offset = 0
        self._prepare_digest(offset)
        if self.size is not None and offset == self.size:
            self._report(offset)
            return
        headers = build_hf_headers()
        headers["Accept-Encoding"] = "identity"  # byte offsets and sizes must be of the file itself
        if urlsplit(self.remote.location).netloc != urlsplit(self.remote.url).netloc:
            headers.pop("authorization", None)  # a CDN's signed URL: the token stays with the Hub
        if offset:
            headers["Range"] = f"bytes={offset}-"
        try:
            with get_session().stream(
                "GET",
                self.remote.location,
                headers=headers,
                timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
                follow_redirects=True,
            ) as response:
                offset = self._check_answer(response, offset)
                self._receive(response, offset)
        except httpx2.TransportError as exc:
            raise _Failed(f"the connection failed: {type(exc).__name__}: {exc}") from exc

    def _check_answer(self, response: Any, offset: int) -> int:
        """Validate status, range and announced length; return the offset the body starts at."""
        status = response.status_code
        if status in _RETRY_STATUSES:
            raise _Failed(f"the Hub answered HTTP {status}")
        if status == 416 and offset:
            self._truncate()  # the kept partial file does not fit the blob: start again
            raise _Failed("the Hub refused the resume range")
        if status == 206 and offset:
            first, total = _content_range(response.headers.get("Content-Range"))
            if first != offset:
                raise self._bad(f"asked for bytes from {offset}, the Hub sent a range starting at {first}")
            if self.size is not None and total is not None and total != self.size:
                raise self._bad(f"the Hub's range says the file has {total} bytes, not {self.size}")
        elif status == 200:
            if offset:
                self._truncate()  # Range ignored: the body starts at byte 0 (D3)
                offset = 0
                self._prepare_digest(0)
        else:
            raise self._bad(f"the Hub answered HTTP {status} to a download")
        encoding = response.headers.get("Content-Encoding", "identity").lower()
        length = response.headers.get("Content-Length")
        if encoding == "identity" and length is not None and length.isdigit() and self.size is not None:
            if int(length) != self.size - offset:
                raise self._bad(
                    f"the Hub announced a body of {int(length)} bytes for {self.size - offset} bytes of the file"
                )
        if self.size is None and status == 200 and encoding == "identity" and length and length.isdigit():
            self.size = int(length)
        return offset

    def _receive(self, response: Any, offset: int) -> None:
        done = offset
        limit = self.size
        digest = self._hash
        assert digest is not None
        with self.temp.open("r+b" if offset else "wb", buffering=0) as out:
            out.seek(offset)
            for chunk in response.iter_bytes():
                if limit is not None and done + len(chunk) > limit:
                    raise self._bad(f"the Hub sent more than the {limit} bytes it announced")
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                self._report(done)
        if limit is not None and done < limit:
            raise self._bad(f"the Hub's answer ended after {done} of {limit} bytes")
        self._report(done, force=True)

    # ---- verification and bookkeeping --------------------------------------------------------------

    def _prepare_digest(self, offset: int) -> None:
        """A digest holding exactly the first ``offset`` bytes of the partial file."""
        if self._hash is not None and self._hash.count == offset:
            return
        if self._hash is not None:
            self._hash.close()
        if self.algorithm == "git-sha1" and self.size is None:
            self._hash = BlobDigest("sha256")  # placeholder: the sha1 is computed from the file at the end
        else:
            self._hash = BlobDigest(self.algorithm, self.size)
        if offset:
            self._hash.update_from_file(self.temp, offset)

    def _verify(self) -> None:
        actual_size = self._on_disk()
        if self.size is not None and actual_size != self.size:
            raise self._bad(f"got {actual_size} bytes, the Hub announced {self.size}")
        assert self._hash is not None
        if self.algorithm == "git-sha1" and self._hash.algorithm != "git-sha1":
            self._hash.close()
            self._hash = BlobDigest("git-sha1", actual_size)
            self._hash.update_from_file(self.temp, actual_size)
        actual = self._hash.hexdigest()
        if actual != self.digest:
            what = "sha256" if self.algorithm == "sha256" else "git blob sha1"
            raise self._bad(f"the bytes' {what} is {actual}, the Hub's is {self.digest}; nothing was stored")

    def _check_room(self) -> None:
        if self.size is None:
            return
        need = self.size - self._on_disk()
        free = shutil.disk_usage(self.cache.blobs).free
        if need > free:
            raise AnyformerError(
                ErrorCode.DISK_FULL,
                f"{self.file.name} needs {need} more bytes and {self.cache.blobs} has {free} free",
            )

    def _report(self, done: int, *, force: bool = False) -> None:
        if self.progress is None:
            return
        now = time.monotonic()
        if force or now - self._last_report >= PROGRESS_INTERVAL_SECONDS:
            self._last_report = now
            self.progress(done, self.size)

    def _truncate(self) -> None:
        with self.temp.open("wb"):
            pass

    def _discard(self) -> None:
        self.temp.unlink(missing_ok=True)

    def _bad(self, why: str) -> AnyformerError:
        """A ``DOWNLOAD_FAILED`` for bytes that cannot be right: the partial file goes too."""
        self._discard()
        return AnyformerError(ErrorCode.DOWNLOAD_FAILED, f"{self.file.name} of {self.file.repo_id}: {why}")

    def _disk_full(self, exc: OSError) -> AnyformerError:
        return AnyformerError(
            ErrorCode.DISK_FULL,
            f"the disk holding {self.cache.blobs} filled up while downloading {self.file.name}; "
            "the partial file was removed",
            cause=exc,
        )


def _content_range(value: str | None) -> tuple[int | None, int | None]:
    match = _CONTENT_RANGE.match(value or "")
    if match is None:
        return None, None
    total = match.group(3)
    return int(match.group(1)), (int(total) if total != "*" else None)
