"""A local stand-in for the Hugging Face Hub that the real ``huggingface_hub`` client talks to.

Point ``HF_ENDPOINT`` (and huggingface_hub's import-time constants, see ``hub_fixtures``) at
:attr:`FakeHub.url` and the client's ``model_info``, ``list_repo_tree``, ``hf_hub_download`` and
``snapshot_download`` work against repos held in memory. Faults (cut connections, ignored ranges,
garbage answers, corrupt or short bodies, 5xx) can be switched on per test to check what anyformer
makes of them.

What the server answers, modelled on what huggingface_hub 2.4.0 sends:

- ``GET /api/models/{repo}[/revision/{rev}]`` (``?blobs=true`` adds sizes, blob ids and LFS info);
- ``GET /api/models/{repo}/tree/{rev}[/{path}]`` (``?recursive=true``);
- ``HEAD``/``GET /{repo}/resolve/{rev}/{path}`` with ``X-Repo-Commit``, ``ETag``, ``X-Linked-Etag``,
  ``X-Linked-Size``, ``Accept-Ranges`` and 206 answers to ``Range``;
- ``GET /api/agent-harnesses`` (fetched once per process by the client's user-agent code).

No Xet header is ever sent, so the client always falls back to plain HTTP downloads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.server
import json
import pathlib
import re
import socket
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

if TYPE_CHECKING:
    from typing import Self  # 3.11+, only for the type checker: the kit runs on 3.10

__all__ = ["FakeHub", "StandIn", "git_blob_sha1"]

_DEFAULT_LFS_SUFFIXES = (".gguf", ".onnx", ".safetensors", ".bin", ".data")
_API_MODEL = re.compile(r"^/api/models/(?P<repo>[^/]+(?:/[^/]+)?)(?:/(?P<kind>revision|tree)/(?P<rest>.*))?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+(?:/[^/]+)?)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$", re.IGNORECASE)
#: Request headers kept in :attr:`FakeHub.requests` (lower-case names).
LOGGED_HEADERS = ("range", "authorization", "accept-encoding", "x-hf-download-counter")
_TIMESTAMP = "2024-01-01T00:00:00.000Z"
_GARBAGE = b"<html><body>502 Bad Gateway? no: 200 OK and \x00\xff not JSON</body></html>"
_CHUNK = 64 * 1024
#: A stand-in up to this size is hashed over its whole content; a larger one gets a made-up digest.
_STAND_IN_HASHED = 16 * 1024 * 1024
_FILL_BLOCK = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class StandIn:
    """A file of ``size`` bytes that is ``prefix`` followed by ``fill`` bytes, never held whole.

    It lets a test serve a listing at the Hub's real sizes (a 20 GB GGUF) with tiny real contents
    (its header): range reads of the prefix see real bytes, everything after reads as ``fill``.
    Up to 16 MiB the sha256 and git blob id are those of the whole content; beyond that they are
    made up from the prefix and the size (a download would fail its digest check; a header read
    never looks at it), so that serving a 60 GB listing costs no hashing.
    """

    prefix: bytes
    size: int
    fill: bytes = b"\x00"

    def __post_init__(self) -> None:
        if len(self.fill) != 1:
            raise ValueError("fill is one byte")
        if self.size < len(self.prefix):
            raise ValueError(f"a stand-in of {self.size} bytes cannot hold a {len(self.prefix)}-byte prefix")


def git_blob_sha1(data: bytes) -> str:
    """The git blob id of ``data``: what the Hub uses as the ETag of a regular (non-LFS) file."""
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


@dataclasses.dataclass(frozen=True)
class _Blob:
    """One file's content, in memory or on disk, with the hashes the Hub reports for it."""

    size: int
    sha256: str
    git_sha1: str
    data: bytes | None = None
    path: pathlib.Path | None = None
    #: For a stand-in: ``data`` is its prefix and every byte from ``len(data)`` to ``size`` is this one.
    fill: bytes | None = None

    @classmethod
    def from_stand_in(cls, stand_in: StandIn) -> _Blob:
        prefix, fill = stand_in.prefix, stand_in.fill
        if stand_in.size <= _STAND_IN_HASHED:
            whole = prefix + fill * (stand_in.size - len(prefix))
            sha256, sha1 = hashlib.sha256(whole).hexdigest(), git_blob_sha1(whole)
        else:
            sha256 = hashlib.sha256(prefix + b"%d" % stand_in.size + fill).hexdigest()
            sha1 = hashlib.sha1(sha256.encode()).hexdigest()
        return cls(stand_in.size, sha256, sha1, data=prefix, fill=fill)

    @classmethod
    def from_bytes(cls, data: bytes, store: pathlib.Path | None) -> _Blob:
        sha256 = hashlib.sha256(data).hexdigest()
        if store is None:
            return cls(len(data), sha256, git_blob_sha1(data), data=data)
        path = store / sha256
        if not path.exists():
            path.write_bytes(data)
        return cls(len(data), sha256, git_blob_sha1(data), path=path)

    @classmethod
    def from_path(cls, path: pathlib.Path) -> _Blob:
        size = path.stat().st_size
        sha256 = hashlib.sha256()
        sha1 = hashlib.sha1(b"blob %d\x00" % size)
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                sha256.update(chunk)
                sha1.update(chunk)
        return cls(size, sha256.hexdigest(), sha1.hexdigest(), path=path)

    def send(self, connection: socket.socket, start: int, end: int) -> None:
        """Write bytes ``start`` to ``end`` (exclusive) to ``connection`` as fast as the kernel can."""
        if end <= start:
            return
        if self.fill is not None:
            for offset in range(start, end, _FILL_BLOCK):
                connection.sendall(self.read(offset, min(end, offset + _FILL_BLOCK)))
            return
        if self.data is not None:
            connection.sendall(memoryview(self.data)[start:end])
            return
        assert self.path is not None
        with self.path.open("rb") as f:
            connection.sendfile(f, offset=start, count=end - start)

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive)."""
        if self.fill is not None and self.data is not None:
            end = min(end, self.size)
            head = self.data[start:end]
            return head + self.fill * max(0, end - max(start, len(self.data)))
        if self.data is not None:
            return self.data[start:end]
        assert self.path is not None
        with self.path.open("rb") as f:
            f.seek(start)
            return f.read(max(0, end - start))


@dataclasses.dataclass(frozen=True)
class _File:
    name: str
    blob: _Blob
    lfs: bool

    @property
    def etag(self) -> str:
        return self.blob.sha256 if self.lfs else self.blob.git_sha1

    def pointer(self) -> bytes:
        """The git-lfs pointer file the real Hub keeps in git for an LFS blob."""
        spec = "version https://git-lfs.github.com/spec/v1\n"
        return f"{spec}oid sha256:{self.blob.sha256}\nsize {self.blob.size}\n".encode()

    @property
    def blob_id(self) -> str:
        """The git blob id: of the content for a regular file, of the pointer file for an LFS one."""
        return git_blob_sha1(self.pointer()) if self.lfs else self.blob.git_sha1

    def lfs_info(self, sha_key: str) -> dict[str, int | str]:
        """LFS facts as the API spells them (``sha256`` in model_info, ``oid`` in tree listings)."""
        return {sha_key: self.blob.sha256, "size": self.blob.size, "pointerSize": len(self.pointer())}


@dataclasses.dataclass
class _Commit:
    sha: str
    files: dict[str, _File]
    pipeline_tag: str | None
    tags: list[str]
    gguf: dict[str, Any] | None
    config: dict[str, Any] | None
    library_name: str | None = None


@dataclasses.dataclass
class _Repo:
    repo_id: str
    refs: dict[str, str] = dataclasses.field(default_factory=dict)  # branch or tag -> commit sha
    commits: dict[str, _Commit] = dataclasses.field(default_factory=dict)

    def resolve(self, revision: str) -> _Commit | None:
        sha = self.refs.get(revision, revision)
        return self.commits.get(sha)


class FakeHub:
    """A Hugging Face Hub emulator on ``127.0.0.1`` for tests, with switchable faults.

    Repos live in memory (file contents given as ``bytes``) or are read from disk (contents given as
    a ``pathlib.Path``, or any ``bytes`` when ``root`` is set: they are then written under ``root``).

    Faults, all cleared by :meth:`reset_faults`:

    - ``cut_after[name] = n``: a GET of that file drops the connection once the answer reaches byte
      ``n`` of the file. The entry fires once and is removed, unless ``cut_always`` is set, in which case
      every GET that reaches byte ``n`` is cut (so a resume from ``n`` never makes progress).
    - ``ignore_range``: answer ``Range`` requests with the whole file and 200.
    - ``garbage``: answer every request with HTTP 200 and a body that is not JSON and no Hub headers.
    - ``error_status``: answer every request with this HTTP status (e.g. 500, 503).
    - ``corrupt[name] = offset``: flip that byte in every GET of the file; sizes and headers stay right.
    - ``short_body[name] = n`` / ``long_body[name] = n``: GET bodies of that file are ``n`` bytes shorter /
      longer than the file (Content-Length matches the body; HEAD and the API still give the true size).
    - ``slow[name] = seconds``: GET bodies of that file pause this long after every 64 KiB (a slow link,
      so that tests can overlap two downloads).

    ``requests`` logs every request as ``(method, path_with_query, headers)`` where headers holds the
    :data:`LOGGED_HEADERS` that were sent.
    """

    def __init__(self, root: pathlib.Path | None = None) -> None:
        self.root = root
        self._blob_dir: pathlib.Path | None = None
        if root is not None:
            self._blob_dir = pathlib.Path(root) / "blobs"
            self._blob_dir.mkdir(parents=True, exist_ok=True)
        self._repos: dict[str, _Repo] = {}
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._connections: set[socket.socket] = set()
        self._thread: threading.Thread | None = None
        self.url = ""
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.reset_faults()

    # -- repos ---------------------------------------------------------------------------------

    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, bytes | pathlib.Path | StandIn],
        *,
        revision: str = "main",
        pipeline_tag: str | None = None,
        tags: list[str] | None = None,
        gguf: dict[str, Any] | None = None,
        library_name: str | None = None,
        lfs_suffixes: Iterable[str] = _DEFAULT_LFS_SUFFIXES,
    ) -> str:
        """Add (or replace) ``revision`` of ``repo_id`` with these files; return the new commit sha.

        File names are stored as given, hostile ones included (``../x``), so tests can check that
        clients refuse them. A file is LFS when its name ends with one of ``lfs_suffixes``. A
        :class:`StandIn` is served at its full size from its prefix (never written out).
        """
        suffixes = tuple(s.lower() for s in lfs_suffixes)
        entries: dict[str, _File] = {}
        for name, content in files.items():
            if isinstance(content, StandIn):
                blob = _Blob.from_stand_in(content)
            elif isinstance(content, (bytes, bytearray)):
                blob = _Blob.from_bytes(bytes(content), self._blob_dir)
            else:
                blob = _Blob.from_path(pathlib.Path(content))
            entries[name] = _File(name, blob, name.lower().endswith(suffixes))
        digest = hashlib.sha1(f"{repo_id}\x00{revision}\x00".encode())
        for name in sorted(entries):
            digest.update(f"{name}\x00{entries[name].etag}\x00".encode())
        sha = digest.hexdigest()
        commit = _Commit(sha, entries, pipeline_tag, list(tags or []), gguf, _config_summary(files), library_name)
        with self._lock:
            repo = self._repos.setdefault(repo_id, _Repo(repo_id))
            repo.commits[sha] = commit
            repo.refs[revision] = sha
        return sha

    def remove_repo(self, repo_id: str) -> None:
        """Forget a repo: later requests for it answer ``RepoNotFound``."""
        with self._lock:
            self._repos.pop(repo_id, None)

    # -- faults and log ------------------------------------------------------------------------

    def reset_faults(self) -> None:
        """Switch every fault off."""
        self.cut_after: dict[str, int] = {}
        self.cut_always = False
        self.ignore_range = False
        self.garbage = False
        self.error_status: int | None = None
        self.corrupt: dict[str, int] = {}
        self.short_body: dict[str, int] = {}
        self.long_body: dict[str, int] = {}
        self.slow: dict[str, float] = {}

    def reset(self) -> None:
        """Switch every fault off and clear the request log."""
        self.reset_faults()
        with self._lock:
            self.requests.clear()

    def requests_for(self, name: str, method: str | None = None) -> list[tuple[str, str, dict[str, str]]]:
        """The logged requests whose path ends with ``/name`` (optionally only one method)."""
        with self._lock:
            log = list(self.requests)
        return [r for r in log if urlsplit(r[1]).path.endswith("/" + name) and (method is None or r[0] == method)]

    # -- server --------------------------------------------------------------------------------

    def start(self) -> str:
        """Start serving on a free port in a background thread; return the base URL."""
        if self._server is not None:
            return self.url
        handler = type("_BoundHandler", (_Handler,), {"hub": self})
        server = _Server(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        self._server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="FakeHub", daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop serving; requests after this fail to connect."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        # Handler threads keep serving the client's pooled keep-alive connections after shutdown():
        # hang those up too, so that a stopped hub is unreachable as a real outage would be.
        with self._lock:
            live, self._connections = list(self._connections), set()
        for conn in live:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- request handling (called from handler threads) ----------------------------------------

    def _log(self, method: str, path: str, headers: Mapping[str, str]) -> None:
        kept = {k: headers[k] for k in LOGGED_HEADERS if k in headers}
        with self._lock:
            self.requests.append((method, path, kept))

    def _repo(self, repo_id: str) -> _Repo | None:
        with self._lock:
            return self._repos.get(repo_id)

    def _cut_point(self, name: str) -> int | None:
        with self._lock:
            return self.cut_after.get(name)

    def _cut_fired(self, name: str) -> None:
        with self._lock:
            if not self.cut_always:
                self.cut_after.pop(name, None)


def _config_summary(files: Mapping[str, bytes | pathlib.Path | StandIn]) -> dict[str, Any] | None:
    # The real Hub echoes part of config.json in model_info's ``config``; do the same when it parses.
    content = files.get("config.json")
    if content is None:
        return None
    try:
        if isinstance(content, StandIn):
            raw = content.prefix + content.fill * (content.size - len(content.prefix))
        elif isinstance(content, (bytes, bytearray)):
            raw = bytes(content)
        else:
            raw = pathlib.Path(content).read_bytes()
        data = json.loads(raw)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return {k: data[k] for k in ("model_type", "architectures") if k in data}


class _Server(http.server.ThreadingHTTPServer):
    """The threaded server, quiet about clients that hang up (tests cut and drop connections on purpose)."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Ignore a connection the client reset or closed; report anything else as the base class does."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class _Response(Exception):
    """Raised inside the handler to answer with an error status and Hub error headers."""

    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


class _Handler(http.server.BaseHTTPRequestHandler):
    """Answers one connection's requests for :class:`FakeHub`."""

    hub: FakeHub
    protocol_version = "HTTP/1.1"  # keep-alive, like the Hub; every answer carries Content-Length
    server_version = "FakeHub/1"

    def setup(self) -> None:
        """Register the connection so that :meth:`FakeHub.stop` can hang it up."""
        super().setup()
        with self.hub._lock:
            self.hub._connections.add(self.connection)

    def finish(self) -> None:
        """Forget the connection."""
        with self.hub._lock:
            self.hub._connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: tests read :attr:`FakeHub.requests` instead."""

    def do_GET(self) -> None:
        """Answer a GET."""
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        """Answer a HEAD."""
        self._dispatch("HEAD")

    def _dispatch(self, method: str) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.hub._log(method, self.path, headers)
        hub = self.hub
        try:
            if hub.garbage:
                self._send(200, {"Content-Type": "text/html"}, _GARBAGE, method)
                return
            if hub.error_status is not None:
                body = json.dumps({"error": f"injected HTTP {hub.error_status}"}).encode()
                self._send(hub.error_status, {"Content-Type": "application/json"}, body, method)
                return
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            if url.path == "/api/agent-harnesses":
                self._send_json({"standardEnvVars": [], "harnesses": {}}, method)
            elif match := _API_MODEL.match(url.path):
                self._api_model(method, match, query)
            elif match := _RESOLVE.match(url.path):
                self._resolve(method, match, headers)
            else:
                raise _Response(404, None, f"no route for {url.path}")
        except _Response as answer:
            extra = {"X-Error-Message": answer.message, "Content-Type": "application/json"}
            if answer.code:
                extra["X-Error-Code"] = answer.code
            if answer.commit:
                extra["X-Repo-Commit"] = answer.commit
            self._send(answer.status, extra, json.dumps({"error": answer.message}).encode(), method)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- answers --------------------------------------------------------------------------------

    def _commit(self, repo_id: str, revision: str) -> _Commit:
        repo = self.hub._repo(repo_id)
        if repo is None:
            raise _Response(404, "RepoNotFound", "Repository not found")
        commit = repo.resolve(revision)
        if commit is None:
            raise _Response(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    def _api_model(self, method: str, match: re.Match[str], query: dict[str, list[str]]) -> None:
        repo_id = unquote(match["repo"])
        kind, rest = match["kind"], match["rest"]
        if kind == "tree":
            revision, _, sub = (rest or "").partition("/")
            commit = self._commit(repo_id, unquote(revision))
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            self._send_json(_tree(commit, unquote(sub).strip("/"), recursive), method)
            return
        revision = unquote(rest) if kind == "revision" else "main"
        commit = self._commit(repo_id, revision)
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        self._send_json(_model_info(repo_id, commit, blobs), method)

    def _resolve(self, method: str, match: re.Match[str], headers: Mapping[str, str]) -> None:
        commit = self._commit(unquote(match["repo"]), unquote(match["rev"]))
        name = unquote(match["path"])
        entry = commit.files.get(name)
        if entry is None:
            raise _Response(404, "EntryNotFound", f"{name} does not exist on this revision", commit.sha)
        hub, size = self.hub, entry.blob.size
        base = {
            "X-Repo-Commit": commit.sha,
            "ETag": f'"{entry.etag}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if entry.lfs:
            base["X-Linked-Etag"] = f'"{entry.etag}"'
            base["X-Linked-Size"] = str(size)
        if method == "HEAD":
            self._send(200, base, b"", method, content_length=size)
            return
        start, end, status = 0, size, 200
        wanted = headers.get("range")
        if wanted and not hub.ignore_range:
            parsed = _parse_range(wanted, size)
            if parsed is None:
                raise _Response(416, None, f"Range {wanted!r} not satisfiable for {size} bytes")
            start, end = parsed
            status = 206
            base["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        end_served = end - hub.short_body.get(name, 0)
        extra = hub.long_body.get(name, 0) if end == size else 0
        cut = hub._cut_point(name)
        body_len = max(0, end_served - start) + extra
        self.send_response(status)
        for key, value in base.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(body_len))
        self.end_headers()
        flip = hub.corrupt.get(name)
        pause = hub.slow.get(name)
        if cut is None and flip is None and pause is None:
            entry.blob.send(self.connection, start, end_served)
            if extra:
                self.wfile.write(b"\x00" * extra)
            return
        pos = start
        while pos < end_served:
            stop = min(end_served, pos + _CHUNK)
            if cut is not None and stop > cut:
                stop = cut
            if stop > pos:
                chunk = bytearray(entry.blob.read(pos, stop))
                if flip is not None and pos <= flip < stop:
                    chunk[flip - pos] ^= 0xFF
                self.wfile.write(chunk)
                pos = stop
                if pause:
                    time.sleep(pause)
            if cut is not None and pos >= cut:
                # Drop the connection mid-body: the client sees fewer bytes than Content-Length.
                hub._cut_fired(name)
                self.wfile.flush()
                time.sleep(0.01)
                self.close_connection = True
                return
        if extra:
            self.wfile.write(b"\x00" * extra)

    # -- plumbing -------------------------------------------------------------------------------

    def _send_json(self, data: Any, method: str) -> None:
        self._send(200, {"Content-Type": "application/json"}, json.dumps(data).encode(), method)

    def _send(
        self, status: int, headers: Mapping[str, str], body: bytes, method: str, content_length: int | None = None
    ) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body) if content_length is None else content_length))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(body)


def _parse_range(value: str, size: int) -> tuple[int, int] | None:
    """``(start, end_exclusive)`` for a single ``bytes=`` range, or None when it is not satisfiable."""
    match = _RANGE.match(value)
    if match is None:
        return None
    first, last = match.groups()
    if not first:
        if not last or int(last) == 0:
            return None
        return max(0, size - int(last)), size
    start = int(first)
    end = min(size, int(last) + 1) if last else size
    if start >= size or end <= start:
        return None
    return start, end


def _model_info(repo_id: str, commit: _Commit, blobs: bool) -> dict[str, Any]:
    siblings = []
    for entry in commit.files.values():
        sibling: dict[str, Any] = {"rfilename": entry.name}
        if blobs:
            sibling["size"] = entry.blob.size
            sibling["blobId"] = entry.blob_id
            if entry.lfs:
                sibling["lfs"] = entry.lfs_info("sha256")
        siblings.append(sibling)
    author = repo_id.split("/")[0] if "/" in repo_id else None
    info: dict[str, Any] = {
        "_id": commit.sha[:24],
        "id": repo_id,
        "modelId": repo_id,
        "author": author,
        "sha": commit.sha,
        "lastModified": _TIMESTAMP,
        "createdAt": _TIMESTAMP,
        "private": False,
        "disabled": False,
        "gated": False,
        "downloads": 0,
        "likes": 0,
        "tags": list(commit.tags),
        "library_name": commit.library_name,
        "siblings": siblings,
        "spaces": [],
        "usedStorage": sum(e.blob.size for e in commit.files.values()),
    }
    if commit.pipeline_tag is not None:
        info["pipeline_tag"] = commit.pipeline_tag
    if commit.gguf is not None:
        info["gguf"] = commit.gguf
    if commit.config is not None:
        info["config"] = commit.config
    return info


def _tree(commit: _Commit, folder: str, recursive: bool) -> list[dict[str, Any]]:
    prefix = f"{folder}/" if folder else ""
    entries: dict[str, dict[str, Any]] = {}
    for entry in commit.files.values():
        if not entry.name.startswith(prefix):
            continue
        rest = entry.name[len(prefix) :]
        parts = rest.split("/")
        # Folders on the way to the file are listed too, as the Hub does.
        for depth in range(1, len(parts)):
            if depth > 1 and not recursive:
                break
            path = prefix + "/".join(parts[:depth])
            entries.setdefault(
                path, {"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "path": path}
            )
        if len(parts) > 1 and not recursive:
            continue
        item: dict[str, Any] = {"type": "file", "oid": entry.blob_id, "size": entry.blob.size, "path": entry.name}
        if entry.lfs:
            item["lfs"] = entry.lfs_info("oid")
        entries[entry.name] = item
    return [entries[k] for k in sorted(entries)]
