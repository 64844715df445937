"""The model pool: models load on first use, stay loaded while they fit, and leave least recently used first.

Each model runs as many requests at once as its backend serves (``Loaded.parallel``: llama.cpp
batches ``parallel`` streams, asked for with the pool's ``parallel`` load option; most backends
serve one); the others wait in a bounded queue (past it, ``BUSY`` → 503) and take the slots in
the order they came.
Before a model loads, the policy's chosen verdict says what it takes (``gpu_bytes`` against the
accelerator budget, ``ram_bytes`` against host memory); idle models are unloaded, least recently
used first, until it fits, as Ollama does. The check asks with the load's own options (``parallel``,
``context``), so a batching backend's estimate already holds every stream's KV cache; when the
model serves more streams than its estimate counted (``"auto"`` resolved only at load), the backend is
asked again for that many and the pool makes room for the difference, or unloads the newcomer.
Engines run in isolated worker processes when ``anyformer.load`` offers ``isolate``: a crash fails
that one request and the next one reloads.
An idle model stays loaded for its keep-alive (the pool's, or the latest request's), then is
disposed (:mod:`anyformer.server._keep_alive`); its next request loads it again.
Generations run in worker threads; the slot is freed when the backend lets go of the model, not
when the client leaves, so the next request never finds the model half-stopped.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import inspect
import os
import threading
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import anyformer
from anyformer._loaded import Loaded
from anyformer._plugins import PluginManager
from anyformer.contract._caps import Caps
from anyformer.contract._chunk import Chunk
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._messages import Message
from anyformer.contract._sizes import format_size, parse_size
from anyformer.machine._probe import probe
from anyformer.server._keep_alive import DEFAULT_KEEP_ALIVE, FOREVER, IdleTimer
from anyformer.server._timings import GenerationClock, attach_to_request

#: Requests that may wait for one model while it serves others.
DEFAULT_QUEUE_SIZE = 8
#: Streams per model the server asks backends for (the ``parallel`` load option) unless told: "auto", as
#: many as suit the machine, which a backend that batches decides from its cores, memory and context
#: (llama.cpp: 2 per decode thread, 2 to 16, cut to what half the host memory holds; docs/server.md).
DEFAULT_PARALLEL: int | Literal["auto"] = "auto"
#: Seconds a model's description (its files' headers, read before loading) may take.
DESCRIBE_SECONDS = 60.0
_END = object()


def load_supports_isolation() -> bool:
    """True when this core's ``anyformer.load`` can run the engine in a worker process (``isolate=``)."""
    return "isolate" in inspect.signature(anyformer.load).parameters


def _normalised(ref: str) -> str:
    """One key for one model: a local path is made absolute, a repo id stays as written."""
    expanded = os.path.expanduser(ref)
    return os.path.abspath(expanded) if os.path.exists(expanded) else ref


class _Slots:
    """How many requests may use one model at once: one until it is loaded, then what it serves.

    Waiters are served in the order they came (an ``asyncio.Condition`` wakes them in FIFO order).
    """

    def __init__(self) -> None:
        self.capacity = 1
        self.active = 0
        self._changed = asyncio.Condition()
        #: Who waits, in the order they came: a newcomer never takes a slot ahead of them.
        self._queue: collections.deque[object] = collections.deque()

    async def acquire(self) -> None:
        """Wait for a free slot and take it, after everyone who was waiting before."""
        ticket = object()
        self._queue.append(ticket)
        try:
            async with self._changed:
                await self._changed.wait_for(lambda: self._ahead(ticket) < self.capacity - self.active)
                self.active += 1
        finally:
            self._queue.remove(ticket)
            if self._queue:  # those behind moved up (also when this waiter gave up): let them look again
                asyncio.get_running_loop().create_task(self._wake())

    def _ahead(self, ticket: object) -> int:
        for position, waiting in enumerate(self._queue):
            if waiting is ticket:
                return position
        return len(self._queue)

    def release(self) -> None:
        """Give a slot back (from the event loop's thread)."""
        self.active -= 1
        asyncio.get_running_loop().create_task(self._wake())

    def resize(self, capacity: int) -> None:
        """Serve ``capacity`` requests at once from now on (the model loaded, or was unloaded)."""
        self.capacity = max(1, capacity)
        asyncio.get_running_loop().create_task(self._wake())

    async def _wake(self) -> None:
        async with self._changed:
            self._changed.notify_all()


@dataclasses.dataclass(eq=False)
class _Entry:
    """One model in the pool: its loaded handle (or None), what it takes, and who uses or awaits it."""

    ref: str
    task: str | None
    slot: _Slots = dataclasses.field(default_factory=_Slots)
    loaded: Loaded | None = None
    gpu_bytes: int = 0
    ram_bytes: int = 0
    #: Requests holding or awaiting the slot.
    users: int = 0
    #: Room was made for it and its load is under way.
    loading: bool = False
    #: The same, by client (its address): one client may hold at most :meth:`ModelPool.client_share` of them.
    clients: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    last_used: float = 0.0
    #: Seconds it stays loaded once idle (the latest request's ``keep_alive``, else the pool's).
    keep_alive: float = DEFAULT_KEEP_ALIVE
    #: Counts down ``keep_alive`` while nobody uses it (set when the entry is made).
    timer: IdleTimer | None = None


class Generation:
    """A generation running in a worker thread, read as an async iterator of chunks.

    ``prompt_tokens`` is the backend's count of the prompt, from its chunks, when it reports one. ``cancel`` (from
    any task) stops the backend at its next token; the model's slot is freed once it has stopped.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, cancel: threading.Event) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._head: list[Any] = []
        self._cancel = cancel
        self.prompt_tokens: int | None = None
        #: When its tokens came, for ``timings``, the metrics and the request log.
        self.clock = GenerationClock()

    def put(self, item: Any) -> None:
        """Hand an item from the worker thread to the event loop."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server is gone, nobody reads this any more
            self._cancel.set()

    def cancel(self) -> None:
        """Stop the generation (the client left, or the caller is done)."""
        self._cancel.set()

    def __aiter__(self) -> AsyncIterator[Chunk]:
        return self._chunks()

    async def _next(self) -> Any:
        return self._head.pop() if self._head else await self._queue.get()

    async def _chunks(self) -> AsyncIterator[Chunk]:
        try:
            while True:
                item = await self._next()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    self.clock.fail(item)
                    raise item
                yield item
        finally:
            self.cancel()

    async def first(self) -> None:
        """Wait for the first chunk, raising the error that came instead; the chunk stays for the reader."""
        item = await self._next()
        if isinstance(item, BaseException):
            raise item
        self._head.append(item)


class ModelPool:
    """Models shared by every request of a server, loaded on demand within a budget.

    ``budget`` is the accelerator memory all loaded models may use together (default: what the
    probe found), host memory is what the probe found available when the pool was made;
    ``isolate`` runs each engine in its own process (None: whenever ``anyformer.load`` can);
    ``queue_size`` is how many requests may wait for one busy model; ``parallel`` is the
    ``parallel`` load option (streams per model, for backends that batch; 1: one at a time; "auto":
    as many as the backend finds suit the machine);
    ``plugins`` and ``caps``
    replace the installed backends and the probe (tests, embedding apps); ``keep_alive`` is how many
    seconds an idle model stays loaded (:data:`~anyformer.server._keep_alive.FOREVER`: until it is
    needed elsewhere; 0: unloaded when its request ends); ``options`` are load options every load
    and check asks for.
    """

    def __init__(
        self,
        *,
        budget: int | str | None = None,
        isolate: bool | None = None,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        context: int | None = None,
        parallel: int | Literal["auto"] = 1,
        caps: Caps | None = None,
        plugins: PluginManager | None = None,
        keep_alive: float = DEFAULT_KEEP_ALIVE,
        options: dict[str, Any] | None = None,
    ) -> None:
        self._caps = caps or probe()
        self.gpu_limit = parse_size(budget) if budget is not None else (self._caps.gpu_bytes or 0)
        self.ram_limit = self._caps.ram_bytes
        supported = load_supports_isolation()
        if isolate and not supported:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "this anyformer has no isolated workers (load(isolate=...))")
        self.isolate = supported if isolate is None else isolate
        self.queue_size = queue_size
        if parallel != "auto" and (isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1):
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f'parallel must be "auto" or a positive number of streams, got {parallel!r}'
            )
        self.parallel = parallel
        self._context = context
        #: Backend load options every load asks for besides ``parallel`` (``special_in_content``).
        self.options = dict(options or {})
        #: The plugin manager models load through (None: the installed backends).
        self.plugins = plugins
        self._entries: dict[tuple[str, str | None], _Entry] = {}
        self._load_lock = asyncio.Lock()
        self.preloaded: list[str] = []
        self.keep_alive = keep_alive

    # ---- what is loaded -------------------------------------------------------------------------

    def loaded(self) -> list[dict[str, Any]]:
        """The models loaded now: id, task, backend, what each takes, its worker's pid when isolated,
        its streams (``active`` of ``parallel``), requests waiting, its keep-alive in seconds (None:
        forever) and when it will be unloaded (``expires_at``, Unix time; None while in use or forever)."""
        return [
            {
                "id": entry.ref,
                "task": entry.loaded.task,
                "backend": entry.loaded.backend,
                "gpu_bytes": entry.gpu_bytes,
                "ram_bytes": entry.ram_bytes,
                "worker_pid": getattr(entry.loaded, "worker_pid", None),
                "context": self._context,
                "parallel": entry.slot.capacity,
                "active": entry.slot.active,
                "waiting": max(0, entry.users - entry.slot.active),
                "keep_alive": None if entry.keep_alive == FOREVER else entry.keep_alive,
                "expires_at": entry.timer.expires_at if entry.timer is not None else None,
            }
            for entry in self._entries.values()
            if entry.loaded is not None
        ]

    def queued(self) -> int:
        """Requests waiting for a model's slot now, over every model."""
        return sum(max(0, entry.users - entry.slot.active) for entry in self._entries.values())

    def check(self, ref: str, task: str | None = None) -> tuple[anyformer.Model, anyformer.Selection]:
        """Every backend's verdict on ``ref`` against the pool's budget (blocking; run it in a thread)."""
        return anyformer.check(
            _normalised(ref),
            task=task,
            budget=self.gpu_limit,
            caps=self._caps,
            context=self._context,
            options=self._load_options(),
            plugins=self.plugins,
        )

    # ---- using a model --------------------------------------------------------------------------

    async def preload(self, ref: str, task: str | None = None) -> None:
        """Load ``ref`` now rather than on its first request; it stays loaded until a request says otherwise."""
        entry = await self._checkout(ref, task, FOREVER)
        self._release(entry)
        self.preloaded.append(ref)

    async def generate(
        self,
        ref: str,
        messages: list[Message] | None,
        options: dict[str, Any],
        *,
        cancel: threading.Event | None = None,
        keep_alive: float | None = None,
        client: str | None = None,
    ) -> Generation:
        """Start a generation on ``ref`` (loading it first if needed) once the model is free.

        Errors before the first chunk (loading, the backend refusing the messages) are raised
        here, so a server can answer them with a status code rather than inside a stream.
        ``messages`` is None for a raw completion (``options["prompt"]``).
        ``cancel`` stops the generation; set while the request waits for the model, the
        generation never starts (``CANCELLED``). ``keep_alive`` (seconds) replaces the model's from now on.
        ``client`` names who asks (:meth:`client_share`).
        """
        entry = await self._checkout(ref, None, keep_alive, client)
        cancel = cancel or threading.Event()
        if cancel.is_set():  # the client left while it waited in the queue
            self._release(entry, client=client)
            raise AnyformerError(ErrorCode.CANCELLED, "the client left before its turn came")
        loop = asyncio.get_running_loop()
        generation = Generation(loop, cancel)
        loaded = entry.loaded
        assert loaded is not None
        generation.clock.model, generation.clock.backend = entry.ref, loaded.backend
        attach_to_request(generation.clock)

        def pump() -> None:
            failure: BaseException | None = None
            try:
                stream = loaded.generate(messages, cancel=cancel, **options)
                try:
                    for chunk in stream:
                        if chunk.prompt_tokens is not None:
                            generation.prompt_tokens = chunk.prompt_tokens
                        generation.clock.chunk(chunk.tokens, chunk.prompt_tokens)
                        generation.put(chunk)
                finally:
                    stream.close()
            except BaseException as exc:  # handed to the reader, which raises it
                failure = exc
                generation.put(exc)
            finally:
                try:
                    loop.call_soon_threadsafe(self._release, entry, failure, client)
                except RuntimeError:
                    pass  # the loop is closed: the server is shutting down
                generation.put(_END)

        generation.clock.start()
        threading.Thread(target=pump, name=f"anyformer-serve-{loaded.backend}", daemon=True).start()
        await generation.first()
        return generation

    async def run(
        self,
        ref: str,
        task: str,
        input: Any,
        *,
        keep_alive: float | None = None,
        client: str | None = None,
        **options: Any,
    ) -> Any:
        """Run a non-generation task (``loaded.run``) on ``ref`` loaded for ``task``."""
        entry = await self._checkout(ref, task, keep_alive, client)
        loaded = entry.loaded
        assert loaded is not None
        failure: BaseException | None = None
        try:
            return await asyncio.to_thread(loaded.run, input, **options)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self._release(entry, failure, client)

    async def unload_idle(self, ref: str) -> bool:
        """Unload ``ref`` (every task it is loaded for) unless a request uses it; whether it is gone now."""
        gone = True
        for entry in [e for e in self._entries.values() if e.ref == ref and e.loaded is not None]:
            if entry.users:
                gone = False
            else:
                await self._unload(entry)
        return gone

    async def stop(self, ref: str) -> list[dict[str, Any]]:
        """Unload ``ref`` (every task it is loaded for): now when idle, else when its last request ends.

        Returns one ``{"id", "task", "unloaded"}`` per loaded entry (``unloaded`` false: it was busy and
        leaves once idle); an empty list when ``ref`` is not loaded.
        """
        done: list[dict[str, Any]] = []
        for entry in [e for e in self._entries.values() if e.loaded is not None]:
            if _normalised(entry.ref) != _normalised(ref):
                continue
            entry.keep_alive = 0.0
            idle = entry.users == 0
            if idle:
                await self._expire(entry)
            done.append({"id": entry.ref, "task": entry.task, "unloaded": idle})
        return done

    async def _expire(self, entry: _Entry) -> None:
        """Dispose an idle model whose keep-alive ran out (unless a request came meanwhile)."""
        async with self._load_lock:
            if entry.users == 0 and entry.loaded is not None:
                await self._unload(entry)

    async def close(self) -> None:
        """Unload every model."""
        for entry in list(self._entries.values()):
            await self._unload(entry)
        self._entries.clear()

    # ---- the slot, loading and eviction ---------------------------------------------------------

    def client_share(self, entry: _Entry) -> int:
        """The most requests one client may hold or await on a model: its slots and half its queue.

        So a client that opens requests as fast as it can still leaves the other half of the queue,
        and every slot it frees, to everyone else.
        """
        return entry.slot.capacity + max(1, self.queue_size // 2)

    async def _checkout(
        self, ref: str, task: str | None, keep_alive: float | None = None, client: str | None = None
    ) -> _Entry:
        key = (_normalised(ref), task)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(ref=ref, task=task, keep_alive=self.keep_alive)
            made = entry
            entry.timer = IdleTimer(lambda: self._expire(made))
        if entry.users >= self.queue_size + entry.slot.capacity:
            raise AnyformerError(
                ErrorCode.BUSY,
                f"{ref} is busy and {self.queue_size} requests already wait for it; retry shortly",
            )
        if client is not None and entry.clients[client] >= self.client_share(entry):
            raise AnyformerError(
                ErrorCode.BUSY,
                f"this client already has {entry.clients[client]} requests running or waiting for {ref}, "
                "its share; retry when one ends",
            )
        entry.users += 1
        assert entry.timer is not None
        entry.timer.stop()
        if keep_alive is not None:
            entry.keep_alive = keep_alive
        if client is not None:
            entry.clients[client] += 1
        try:
            await entry.slot.acquire()
        except BaseException:
            entry.users -= 1
            _forget_client(entry, client)
            raise
        try:
            if entry.loaded is None:
                await self._load(entry, key)
                entry.slot.resize(entry.loaded.parallel if entry.loaded is not None else 1)
        except BaseException:
            self._release(entry, client=client)
            raise
        entry.last_used = time.monotonic()
        return entry

    def _release(self, entry: _Entry, failure: BaseException | None = None, client: str | None = None) -> None:
        entry.users -= 1
        _forget_client(entry, client)
        entry.last_used = time.monotonic()
        crashed = isinstance(failure, AnyformerError) and failure.code is ErrorCode.BACKEND_CRASHED
        if crashed and entry.loaded is not None:
            # The engine died: forget it, so the next request loads a fresh one.
            loaded, entry.loaded = entry.loaded, None
            threading.Thread(target=_dispose_quietly, args=(loaded,), daemon=True).start()
        if entry.loaded is None and entry.users == 0:
            key = (_normalised(entry.ref), entry.task)
            if self._entries.get(key) is entry:
                del self._entries[key]
        if entry.users == 0 and entry.loaded is not None and entry.timer is not None:
            entry.timer.start(entry.keep_alive)
        entry.slot.release()

    async def _load(self, entry: _Entry, key: tuple[str, str | None]) -> None:
        """Describe, make room, load. The lock covers only making room (so two newcomers never both
        count the same free memory): a describe or a load that hangs holds no other model's load."""
        describing = asyncio.to_thread(self._describe_and_check, key[0], entry.task)
        try:
            model, selection = await asyncio.wait_for(describing, DESCRIBE_SECONDS)
        except asyncio.TimeoutError:
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"{entry.ref}: reading the model's files did not finish in {DESCRIBE_SECONDS:g} s"
            ) from None
        async with self._load_lock:
            if selection.chosen is not None and selection.chosen.estimate is not None:
                entry.gpu_bytes = selection.chosen.estimate.gpu_bytes
                entry.ram_bytes = selection.chosen.estimate.ram_bytes
                await self._make_room(entry)
            entry.loading = True  # counted as resident by others' _make_room from now on
        try:
            entry.loaded = await asyncio.to_thread(self._load_blocking, model, entry.task)
        finally:
            entry.loading = False
        async with self._load_lock:
            await self._count_every_stream(entry, model, selection)

    async def _count_every_stream(self, entry: _Entry, model: anyformer.Model, selection: anyformer.Selection) -> None:
        """Size a just-loaded model for the streams it serves when its estimate counted fewer.

        A backend that resolves ``parallel="auto"`` only while loading cannot count those streams'
        KV cache in its estimate: the estimate names the streams it counted (``details["parallel"]``,
        1 when absent), the handle the streams it serves. When the handle serves more, the backend is
        asked again with that number, and idle models leave to make room; when they cannot, the
        newcomer is unloaded and ``BUSY`` raised rather than host memory over-committed.
        """
        loaded, chosen = entry.loaded, selection.chosen
        if loaded is None or chosen is None or chosen.estimate is None:
            return
        counted = chosen.estimate.details.get("parallel", 1)
        if not isinstance(counted, int) or loaded.parallel <= counted:
            return
        again = await asyncio.to_thread(
            self._check_described, model, entry.task, {**self._load_options(), "parallel": loaded.parallel}
        )
        estimate = next(
            (v.estimate for v in again.verdicts if v.backend == loaded.backend and v.ok and v.estimate is not None),
            None,
        )
        if estimate is None:  # the backend refuses that many streams now: keep what it said before
            return
        entry.gpu_bytes = max(entry.gpu_bytes, estimate.gpu_bytes)
        entry.ram_bytes = max(entry.ram_bytes, estimate.ram_bytes)
        try:
            await self._make_room(entry)
        except AnyformerError:
            await self._unload(entry)
            raise

    def _load_options(self) -> dict[str, Any]:
        """The backend options every load asks for; every check asks with them too, so estimates count them."""
        return {**self.options, "parallel": self.parallel} if self.parallel != 1 else dict(self.options)

    def _describe_and_check(self, ref: str, task: str | None) -> tuple[anyformer.Model, anyformer.Selection]:
        model = anyformer.describe(ref)
        return model, self._check_described(model, task, self._load_options())

    def _check_described(
        self, model: anyformer.Model, task: str | None, options: dict[str, Any]
    ) -> anyformer.Selection:
        _, selection = anyformer.check(
            model,
            task=task,
            budget=self.gpu_limit,
            caps=self._caps,
            context=self._context,
            options=options,
            plugins=self.plugins,
        )
        return selection

    def _load_blocking(self, model: anyformer.Model, task: str | None) -> Loaded:
        extra: dict[str, Any] = {"isolate": self.isolate} if load_supports_isolation() else {}
        if self._load_options():
            extra["options"] = self._load_options()
        return anyformer.load(
            model,
            task=task,
            budget=self.gpu_limit,
            caps=self._caps,
            context=self._context,
            plugins=self.plugins,
            **extra,
        )

    async def _make_room(self, newcomer: _Entry) -> None:
        """Unload idle models, least recently used first, until ``newcomer`` fits beside the rest."""
        while True:
            resident = [e for e in self._entries.values() if (e.loaded is not None or e.loading) and e is not newcomer]
            gpu = sum(e.gpu_bytes for e in resident) + newcomer.gpu_bytes
            ram = sum(e.ram_bytes for e in resident) + newcomer.ram_bytes
            if (gpu <= self.gpu_limit or not newcomer.gpu_bytes) and ram <= self.ram_limit:
                return
            idle = sorted((e for e in resident if e.users == 0 and e.loaded is not None), key=lambda e: e.last_used)
            if not idle:
                if not resident:
                    return  # nothing to unload; the load itself says whether it fits
                raise AnyformerError(
                    ErrorCode.BUSY,
                    f"{newcomer.ref} needs {format_size(newcomer.gpu_bytes)} GPU and {format_size(newcomer.ram_bytes)} "
                    f"RAM, and every loaded model is busy; retry shortly",
                )
            await self._unload(idle[0])

    async def _unload(self, entry: _Entry) -> None:
        if entry.timer is not None:
            entry.timer.stop()
        loaded, entry.loaded = entry.loaded, None
        entry.slot.resize(1)
        if loaded is not None:
            await asyncio.to_thread(_dispose_quietly, loaded)
        if entry.users == 0:
            self._entries.pop((_normalised(entry.ref), entry.task), None)


def _forget_client(entry: _Entry, client: str | None) -> None:
    if client is not None:
        entry.clients[client] -= 1
        if entry.clients[client] <= 0:
            del entry.clients[client]


def _dispose_quietly(loaded: Loaded) -> None:
    try:
        loaded.dispose()
    except Exception:  # a crashed engine may fail to dispose; its memory is gone with its process
        pass
