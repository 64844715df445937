"""What the server's tests share: uvicorn on a free loopback port, plain HTTP requests, an in-process backend.

The in-process backend (``paced``) streams one word every few milliseconds until it is cancelled
or reaches ``max_new_tokens``, embeds by hashing, and fails on cue; it lets fault tests be exact.
In-process plugins cannot cross into worker processes, so its pools run with ``isolate=False``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.client
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from anyformer import AnyformerError, Chunk, Estimate, ProgressEvent, Rank, Refusal, StoreEntry, Verdict, hookimpl
from anyformer.plugin import BackendModel, Features

#: Seconds between the paced backend's tokens.
PACE = 0.01
#: A prompt that makes the paced backend's engine "crash" after two tokens.
CRASH_PROMPT = "please crash"
#: A prompt that makes the paced backend show drafts (``Chunk.preview``), as a text-diffusion model does.
DRAFT_PROMPT = "show your drafts"


@dataclasses.dataclass
class Reply:
    """A plain HTTP reply: status, headers (lower-case names) and body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def plain_request(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> Reply:
    """One HTTP request with the standard library; ``body`` is bytes as they are, or JSON."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    raw = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    try:
        connection.request(method, path, body=raw, headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()


@contextlib.contextmanager
def serve_in_thread(app: Any, **config: Any) -> Iterator[str]:
    """Run ``app`` with uvicorn on a free loopback port in a thread; yields the base URL.

    ``config`` goes to ``uvicorn.Config`` (``http=`` the server's own protocol, for instance).
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = {"log_level": "warning", "lifespan": "on", **config}
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, **settings))
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


class PacedHandle(BackendModel):
    """A model of :class:`PacedBackend`, which generates for it.

    Its ``features``: the sampling options the core lets through to it (:class:`PacedBackend`'s
    ``honours``), the streams it serves, and run() reporting each text and stopping between texts
    when cancelled (each input "slow" takes 50 ms).
    """

    #: The ``parallel`` load option it was loaded with (1 when absent).
    asked_parallel: Any = 1

    def __init__(self, owner: PacedBackend, task: str, ref: str) -> None:
        self.owner = owner
        self.backend = owner.name
        self.task = task
        self.ref = ref
        self.disposed = False
        self.parallel = 1
        self.runs: list[tuple[str, int]] = []  # how each run() ended, and the texts it had embedded
        self.features = Features(run_progress=True)

    def generate(self, messages: Any, options: Any) -> Iterator[Chunk]:
        return self.owner.generate_on(self, messages, options)

    def dispose(self) -> None:
        self.disposed = True

    def run(self, input: Any, progress: Any = None, **options: Any) -> dict[str, Any]:
        vectors = []
        try:
            for text in input:
                if text == "slow":
                    time.sleep(0.05)
                vectors.append([b / 255 for b in hashlib.sha256(text.encode()).digest()[:8]])
                if progress is not None:
                    progress(ProgressEvent(stage="embed", done=len(vectors), total=len(input)))
        except AnyformerError as exc:
            self.runs.append((exc.code.value, len(vectors)))
            raise
        self.runs.append(("done", len(vectors)))
        return {"embeddings": vectors, "tokens": sum(len(text.split()) for text in input)}


class PacedBackend:
    """An in-process backend that streams words at a steady pace and records what happened to them."""

    name = "paced"

    def __init__(
        self,
        ram_bytes: int = 10**6,
        refuse: dict[str, str] | None = None,
        stream_bytes: int = 0,
        honours: frozenset[str] = frozenset(),
    ) -> None:
        #: The sampling options its handles declare they honour (they never sample: the values only pass).
        self.honours = honours
        self.ram_bytes = ram_bytes
        #: Host memory each stream adds (a KV region per stream, as llama.cpp's estimate counts it).
        self.stream_bytes = stream_bytes
        self.checked_options: list[dict[str, Any]] = []  # the options of every can_run, in order
        #: Model folder name -> the refusal code this backend answers for it (``budget`` carries a need).
        self.refuse = refuse or {}
        self.handles: list[PacedHandle] = []
        self.finished: list[str] = []  # the finish reason of every generation, once its stream closed
        self.lock = threading.Lock()

    @hookimpl
    def can_run(self, model: Any, caps: Any, request: Any) -> Verdict:
        code = self.refuse.get(Path(model.ref).name)
        if code == "budget":
            return Verdict.refuse(self.name, Refusal.BUDGET, "needs 5 GB of GPU memory", need=5 * 10**9)
        if code is not None:
            return Verdict.refuse(self.name, code, f"refused on cue ({code})")
        self.checked_options.append(dict(request.options))
        # An int parallel is counted before load; "auto" is resolved only by load (2 here), so the estimate
        # counts one stream and does not claim to know the number.
        asked = request.options.get("parallel", 1)
        streams = asked if isinstance(asked, int) else 1
        details = {"parallel": streams} if isinstance(asked, int) else {}
        estimate = Estimate(
            ram_bytes=self.ram_bytes + streams * self.stream_bytes,
            tok_per_sec=100.0,
            rank=Rank.GENERAL,
            details=details,
        )
        return Verdict.accept(self.name, estimate)

    @hookimpl
    def store_list(self) -> list[StoreEntry]:
        return [StoreEntry(self.name, "paced-org/stored-model", "main", "/nowhere", 1234)]

    @hookimpl
    def load(self, model: Any, request: Any) -> PacedHandle:
        handle = PacedHandle(self, request.task or "text-generation", model.ref)
        handle.asked_parallel = request.options.get("parallel", 1)
        # Its streams share nothing: any number run; "auto" (the server's default) is 2 here.
        handle.parallel = 2 if handle.asked_parallel == "auto" else int(handle.asked_parallel)
        handle.features = dataclasses.replace(handle.features, honours=self.honours, parallel=handle.parallel)
        self.handles.append(handle)
        return handle

    def generate_on(self, loaded: Any, messages: Any, options: Any) -> Iterator[Chunk]:
        """What its handles' ``generate`` returns: one word per token at a steady pace."""
        if loaded.task != "text-generation":
            raise AnyformerError("BAD_REQUEST", "this model embeds; it does not generate")
        return self._words(messages[-1]["content"], options)

    def _words(self, prompt: str, options: Any) -> Iterator[Chunk]:
        reason = "cancelled"
        try:
            for count in range(1, options.max_new_tokens + 1):
                if options.cancel.is_set():
                    break
                time.sleep(PACE)
                if prompt == CRASH_PROMPT and count == 3:
                    raise AnyformerError("BACKEND_CRASHED", "the paced engine died (exit code -9)")
                last = count == options.max_new_tokens
                if last:
                    reason = "length"
                # Drafts: the words so far, then a masked guess at the rest of the answer.
                draft = "".join(f"w{i} " for i in range(1, count + 1)) + "\u2591" * (options.max_new_tokens - count)
                preview = draft if prompt == DRAFT_PROMPT and not last else None
                yield Chunk(delta=f"w{count} ", tokens=count, finish_reason="length" if last else None, preview=preview)
        finally:
            with self.lock:
                self.finished.append(reason)
