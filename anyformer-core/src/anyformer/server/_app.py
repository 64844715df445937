"""The Starlette application: OpenAI's endpoints, the verdicts endpoint, the chat page, and the API key.

No route knows a backend: models go through the pool, which goes through ``anyformer.check`` and
``anyformer.load`` and the selection policy. Every model a request names passes the operator's
rules first (:mod:`anyformer.server._access`), every request the browser rules
(:mod:`anyformer.server._guard`), and every body a size limit and a strict JSON parse.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib.util
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from importlib import resources
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from anyformer._plugins import PluginManager, get_plugin_manager
from anyformer.contract._chunk import TokenLogprob
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.server._access import ModelAccess, loadable
from anyformer.server._chat_reply import ChatReply
from anyformer.server._connections import AmbiguousFramingGuard, install_shortage_log
from anyformer.server._errors import ApiError, anyformer_error_body, bad_request, error_response
from anyformer.server._guard import RequestGuard
from anyformer.server._keep_alive import request_keep_alive
from anyformer.server._limits import BodyParser, embedding_batches
from anyformer.server._page_policy import page_headers
from anyformer.server._pool import Generation, ModelPool
from anyformer.server._ps_routes import PsRoutes
from anyformer.server._request_fields import named_for_http
from anyformer.server._request_log import RequestObserver
from anyformer.server._schemas import (
    EMBEDDING_TASK,
    MAX_MODEL_CHARS,
    GenerationRequest,
    chat_chunk,
    chat_completion,
    completion_choice,
    completion_logprobs,
    embeddings_list,
    new_id,
    parse_chat,
    parse_completion,
    parse_embeddings_request,
    text_completion,
    usage,
)
from anyformer.server._sse import DONE, EventStream, event

#: Paths that need the API key when the server has one.
_PROTECTED_PREFIXES = ("/v1/", "/api/", "/metrics")
#: The largest request body read by default: a long conversation, or a few photos as data URLs.
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
#: The longest a request body may pause between two of its parts before the request is refused (408).
BODY_PAUSE_SECONDS = 30.0
_T = TypeVar("_T")


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "REQUEST_TOO_LARGE", f"the request body is over {limit:,} bytes (the server's --max-body)")


async def _body_bytes(request: Request, limit: int) -> bytes:
    """The body's bytes: at most ``limit`` (read no further), each part within :data:`BODY_PAUSE_SECONDS`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    parts: list[bytes] = []
    size = 0
    stream = request.stream().__aiter__()
    while True:
        try:
            part = await asyncio.wait_for(stream.__anext__(), BODY_PAUSE_SECONDS)
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            raise ApiError(
                408, "REQUEST_TIMEOUT", f"the request body paused for over {BODY_PAUSE_SECONDS:g} s"
            ) from None
        size += len(part)
        if size > limit:
            raise _too_large(limit)
        parts.append(part)
    return b"".join(parts)


async def _form_body(request: Request, limit: int) -> Any:
    """A multipart (or URL-encoded) form of at most ``limit`` bytes, read no further; 400 when malformed."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    size = 0

    async def receive() -> Any:
        nonlocal size
        message = await request.receive()
        size += len(message.get("body", b""))
        if size > limit:
            raise _too_large(limit)
        return message

    if importlib.util.find_spec("python_multipart") is None:
        raise bad_request("this server reads no forms: pip install 'anyformer[serve]' (python-multipart)")
    bounded = Request(request.scope, receive)
    try:
        return await bounded.form(max_files=1, max_fields=16)
    except HTTPException as exc:  # Starlette's word for a malformed multipart body
        raise bad_request(f"the form could not be read: {exc.detail}") from None


class _Api:
    """The route handlers, sharing one pool and one set of the operator's rules."""

    def __init__(self, pool: ModelPool, access: ModelAccess, max_body: int) -> None:
        self.pool = pool
        self.access = access
        self.max_body = max_body
        self.parser = BodyParser()

    async def _parsed(self, request: Request, check: Callable[[Any], _T]) -> _T:
        """The body read, parsed and checked by ``check``, its cost bounded (:mod:`anyformer.server._limits`)."""
        return await self.parser.parse(await _body_bytes(request, self.max_body), check)

    async def _resolve(self, ref: str) -> str:
        """The reference the pool loads for a client's ``model``; 404 when the server does not serve it."""
        return await asyncio.to_thread(self.access.resolve, ref)

    async def models(self, request: Request) -> JSONResponse:
        """``GET /v1/models``: loaded models, the operator's, then whatever the store holds."""
        return JSONResponse({"object": "list", "data": await self._model_list()})

    async def retrieve(self, request: Request) -> JSONResponse:
        """``GET /v1/models/{id}``: one model as ``/v1/models`` lists it; 404 when the server does not serve it."""
        ref = request.path_params["model_id"]
        for item in await self._model_list():
            if item["id"] == ref:
                return JSONResponse(item)
        resolved = await self._resolve(ref)  # a name the server serves but does not list (an allowed path, a pull)
        loaded = [item for item in self.pool.loaded() if item["id"] in (ref, resolved)]
        facts = {"loaded": True, "backend": loaded[0]["backend"]} if loaded else {"loaded": False}
        return JSONResponse({"id": ref, "object": "model", "created": 0, "owned_by": "anyformer", **facts})

    async def _model_list(self) -> list[dict[str, Any]]:
        seen: dict[str, dict[str, Any]] = {}
        for item in self.pool.loaded():
            # A model removed from the disk (anyformer rm) is unloaded once idle, not listed as loaded.
            if await asyncio.to_thread(self.access.removed, item["id"]) and await self.pool.unload_idle(item["id"]):
                continue
            seen.setdefault(item["id"], {"loaded": True, "backend": item["backend"], "task": item["task"]})
        for ref in self.access.models:
            seen.setdefault(ref, {"loaded": False})
        for entry in await asyncio.to_thread(self.access.stored):
            seen.setdefault(entry["repo"], {"loaded": False, "backend": entry["backend"], "stored": True})
        return [
            {"id": ref, "object": "model", "created": 0, "owned_by": "anyformer", **facts}
            for ref, facts in seen.items()
        ]

    async def check(self, request: Request) -> JSONResponse:
        """``GET /api/check?model=…[&task=…]``: every backend's verdict and the one chosen, as ``anyformer check``."""
        ref = request.query_params.get("model", "").strip()
        if not ref:
            raise bad_request("give ?model=… (an id GET /v1/models lists)", "model")
        if len(ref) > MAX_MODEL_CHARS:
            raise bad_request(f"'model' is {len(ref):,} characters; at most {MAX_MODEL_CHARS} are read", "model")
        resolved = await self._resolve(ref)
        model, selection = await asyncio.to_thread(self.pool.check, resolved, request.query_params.get("task") or None)
        return JSONResponse(
            {
                "model": model.to_dict(),
                "chosen": selection.chosen_backend,
                "verdicts": [v.to_dict() for v in selection.verdicts],
                "budget": self.pool.gpu_limit,
            }
        )

    async def chat_completions(self, request: Request) -> Response:
        """``POST /v1/chat/completions``, streamed over SSE or whole."""
        parsed, keep_alive = await self._parsed(request, lambda body: (parse_chat(body), request_keep_alive(body)))
        return await self._chat(request, parsed, keep_alive)

    async def completions(self, request: Request) -> Response:
        """``POST /v1/completions``: each prompt continued as written (no chat template), one choice each.

        The prompts run one after another; a backend without raw text answers ``BAD_REQUEST``.
        """
        parsed, keep_alive = await self._parsed(
            request, lambda body: (parse_completion(body), request_keep_alive(body))
        )
        resolved = await self._resolve(parsed.model)
        client = _client_of(request)
        rid = new_id("cmpl")
        if parsed.stream:
            # The first generation starts before the response does, so its errors get a status code.
            gone = threading.Event()
            first = await _until_disconnect(
                request, self._start_raw(resolved, parsed, 0, client, gone, keep_alive), gone
            )
            return EventStream(self._completion_events(resolved, parsed, rid, first, client, keep_alive))
        choices: list[dict[str, Any]] = []
        prompt_tokens: int | None = 0
        completion_tokens = 0
        for index, prompt in enumerate(parsed.prompts):
            gone = threading.Event()
            generation = await _until_disconnect(
                request, self._start_raw(resolved, parsed, index, client, gone, keep_alive), gone
            )
            text, finish, tokens = "", None, 0
            entries: list[TokenLogprob] = []
            prompt_entries: list[TokenLogprob] = []
            try:
                async for chunk in _watching(request, generation):
                    text, finish, tokens = chunk.text, chunk.finish_reason, chunk.tokens
                    entries.extend(chunk.logprobs)
                    prompt_entries.extend(chunk.prompt_logprobs)
            finally:
                generation.cancel()
            scored = "logprobs" in parsed.options
            logprobs = completion_logprobs(entries, len(prompt), prompt_entries) if scored else None
            choices.append(completion_choice(index, prompt + text if parsed.echo else text, finish, logprobs))
            completion_tokens += tokens
            counted = generation.prompt_tokens
            prompt_tokens = None if prompt_tokens is None or counted is None else prompt_tokens + counted
        use = usage(prompt_tokens, completion_tokens)
        whole = text_completion(rid, parsed.model, "", None, use, choices=choices)
        if len(parsed.prompts) == 1:
            whole["timings"] = generation.clock.timings()
        return JSONResponse(whole)

    async def _start_raw(
        self,
        resolved: str,
        parsed: GenerationRequest,
        index: int,
        client: str | None,
        cancel: threading.Event | None = None,
        keep_alive: float | None = None,
    ) -> Generation:
        options = {**parsed.options, "prompt": parsed.prompts[index]}
        return await self.pool.generate(resolved, None, options, cancel=cancel, keep_alive=keep_alive, client=client)

    async def _completion_events(
        self,
        resolved: str,
        parsed: GenerationRequest,
        rid: str,
        first: Generation,
        client: str | None,
        keep_alive: float | None,
    ) -> AsyncIterator[bytes]:
        """The SSE events of a streamed ``/v1/completions``: each prompt's choice in turn, by its index."""
        model = parsed.model
        scored = "logprobs" in parsed.options
        prompt_tokens: int | None = 0
        completion_tokens = 0
        generation: Generation | None = first
        try:
            for index, prompt in enumerate(parsed.prompts):
                if generation is None:
                    generation = await self._start_raw(resolved, parsed, index, client, keep_alive=keep_alive)
                tokens = 0
                # With logprobs the echoed prompt waits for the first chunk: it carries the prompt's scores.
                echoing = parsed.echo and (bool(prompt) or scored)
                try:
                    if echoing and not scored:
                        yield event(text_completion(rid, model, prompt, None, None, index=index))
                        echoing = False
                    async for chunk in generation:
                        if echoing:
                            echoing = False
                            scores = completion_logprobs((), 0, chunk.prompt_logprobs)
                            yield event(text_completion(rid, model, prompt, None, None, index=index, logprobs=scores))
                        tokens = chunk.tokens
                        if chunk.delta or chunk.finish_reason or chunk.logprobs:
                            logprobs = completion_logprobs(chunk.logprobs, len(prompt)) if scored else None
                            piece = text_completion(
                                rid, model, chunk.delta, chunk.finish_reason, None, index=index, logprobs=logprobs
                            )
                            yield event(piece)
                finally:
                    generation.cancel()
                completion_tokens += tokens
                counted = generation.prompt_tokens
                prompt_tokens = None if prompt_tokens is None or counted is None else prompt_tokens + counted
                generation = None
            if parsed.include_usage:
                use = usage(prompt_tokens, completion_tokens)
                yield event(text_completion(rid, model, "", None, use, choices=[]))
        except AnyformerError as exc:
            yield event(anyformer_error_body(exc))
        finally:
            if generation is not None:
                generation.cancel()
        yield DONE

    async def embeddings(self, request: Request) -> JSONResponse:
        """``POST /v1/embeddings`` through ``loaded.run`` on the model loaded for feature extraction."""
        (model, inputs, encoding), keep_alive = await self._parsed(
            request, lambda body: (parse_embeddings_request(body), request_keep_alive(body))
        )
        resolved = await self._resolve(model)
        vectors: list[list[float]] = []
        tokens = 0
        # A batch at a time, each taking its turn at the model: a long request never holds it from others.
        for batch in embedding_batches(inputs):
            gone = threading.Event()  # set when the client leaves: the backend stops at its next unit
            work = self.pool.run(
                resolved, EMBEDDING_TASK, batch, cancel=gone, keep_alive=keep_alive, client=_client_of(request)
            )
            batch_vectors, batch_tokens = _embeddings_of(await _until_disconnect(request, work, gone), len(batch))
            vectors += batch_vectors
            tokens += batch_tokens
        return JSONResponse(embeddings_list(model, vectors, encoding, tokens))

    async def transcriptions(self, request: Request) -> Response:
        """``POST /v1/audio/transcriptions`` (multipart) on a speech model: decoded, resampled, transcribed."""
        from anyformer._audio_decode import WHISPER_RATE, decode_audio
        from anyformer.server._transcriptions import SPEECH_TASK, parse_transcription_form, transcription_response

        form = await _form_body(request, self.max_body)
        try:
            parsed = await parse_transcription_form(form)
        finally:
            await form.close()
        resolved = await self._resolve(parsed.model)
        samples = await asyncio.to_thread(decode_audio, parsed.audio)
        clip = {"raw": samples, "sampling_rate": WHISPER_RATE}
        gone = threading.Event()  # set when the client leaves: the model stops between two 30 s windows
        work = self.pool.run(resolved, SPEECH_TASK, clip, cancel=gone, keep_alive=parsed.keep_alive, **parsed.options)
        result = await _until_disconnect(request, work, gone)
        return transcription_response(parsed, result, samples.size / WHISPER_RATE)

    async def _chat(self, request: Request, parsed: GenerationRequest, keep_alive: float | None = None) -> Response:
        resolved = await self._resolve(parsed.model)
        gone = threading.Event()  # set when the client leaves: a request still queued then never starts
        try:
            generation = await _until_disconnect(
                request,
                self.pool.generate(
                    resolved,
                    parsed.messages,
                    parsed.options,
                    cancel=gone,
                    keep_alive=keep_alive,
                    client=_client_of(request),
                ),
                gone,
            )
        except AnyformerError as exc:
            raise named_for_http(exc) from None
        rid = new_id("chatcmpl")
        if parsed.stream:
            return EventStream(_chat_events(generation, parsed, rid))
        reply = ChatReply(parsed.options)
        text, finish, tokens, opened = "", None, 0, False
        try:
            async for chunk in _watching(request, generation):
                text, finish, tokens = chunk.text, chunk.finish_reason, chunk.tokens
                opened = chunk.thinking_opened
                reply.add_logprobs(chunk.logprobs)
        finally:
            generation.cancel()
        use = usage(generation.prompt_tokens, tokens)
        message, finish = reply.message(text, finish, opened)
        whole = chat_completion(rid, parsed.model, text, finish, use, message=message, logprobs=reply.logprobs())
        whole["timings"] = generation.clock.timings()  # llama-server's extension: the prompt's and the reply's speed
        return JSONResponse(whole)


async def _chat_events(generation: Generation, parsed: GenerationRequest, rid: str) -> AsyncIterator[bytes]:
    """The SSE events of one streamed chat reply; an error after the first chunk becomes an ``error`` event."""
    model = parsed.model
    tokens = 0
    reply = ChatReply(parsed.options)
    try:
        yield event(chat_chunk(rid, model, {"role": "assistant", "content": ""}))
        async for chunk in generation:
            tokens = chunk.tokens
            preview = chunk.preview if parsed.preview else None
            if chunk.delta or chunk.finish_reason or preview is not None or chunk.logprobs:
                pieces = reply.deltas(chunk.delta, chunk.finish_reason, chunk.logprobs, chunk.thinking_opened)
                for delta, finish, logprobs in pieces:
                    if preview is not None:
                        # anyformer's extension, asked for by the chat page: the answer as it stands, unsettled.
                        delta["anyformer_preview"] = preview
                        preview = None
                    piece = chat_chunk(rid, model, delta, finish, logprobs=logprobs)
                    if finish:  # llama-server sends its timings with the last chunk
                        piece["timings"] = generation.clock.timings()
                    yield event(piece)
                if preview is not None:
                    yield event(chat_chunk(rid, model, {"anyformer_preview": preview}))
        if parsed.include_usage:
            yield event(chat_chunk(rid, model, {}, use=usage(generation.prompt_tokens, tokens)))
    except AnyformerError as exc:
        yield event(anyformer_error_body(exc))
    finally:
        generation.cancel()
    yield DONE


async def _watching(request: Request, generation: Generation) -> AsyncIterator[Any]:
    """Read a generation, cancelling it if the client disconnects before it ends."""
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    watcher.add_done_callback(lambda task: None if task.cancelled() else generation.cancel())
    try:
        async for chunk in generation:
            yield chunk
    finally:
        watcher.cancel()


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _until_disconnect(request: Request, work: Awaitable[Any], gone: threading.Event | None = None) -> Any:
    """Await ``work`` (waiting in a queue, loading), giving up when the client disconnects first (``gone`` is set)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task not in done:
        if gone is not None:
            gone.set()
        task.add_done_callback(_cancel_result)
        raise AnyformerError(ErrorCode.CANCELLED, "the client disconnected before the model was ready")
    return task.result()


def _client_of(request: Request) -> str | None:
    """Who sends a request, for the pool's per-client share: the peer's address (None: unknown)."""
    return request.client.host if request.client is not None else None


def _cancel_result(task: asyncio.Future[Any]) -> None:
    """A generation that started after its client left is cancelled at once (its error, if any, is dropped)."""
    if task.cancelled() or task.exception() is not None:
        return
    if isinstance(task.result(), Generation):
        task.result().cancel()


def _embeddings_of(result: Any, count: int) -> tuple[list[list[float]], int]:
    """A backend's ``run`` result as vectors and a token count: a list of vectors, or ``{"embeddings", "tokens"}``."""
    tokens = 0
    if isinstance(result, dict):
        tokens = int(result.get("tokens") or 0)
        result = result.get("embeddings")
    vectors = [[float(x) for x in vector] for vector in (result if result is not None else [])]
    if len(vectors) != count:
        raise AnyformerError(
            ErrorCode.PLUGIN_ERROR, f"the backend returned {len(vectors)} embeddings for {count} inputs"
        )
    return vectors, tokens


def _stored_models(plugins: PluginManager | None) -> list[dict[str, Any]]:
    """What the store holds (``anyformer ls``'s listing when this core has it, else the backends' ``store_list``).

    A listing that fails leaves the stored models out; it never fails ``/v1/models``.
    """
    manager = plugins or get_plugin_manager()
    try:
        try:
            from anyformer._cache_listing import list_store
        except ImportError:
            entries, _problems = manager.store_list()
        else:
            entries, _problems = list_store(manager)
    except Exception:
        return []
    return [entry.to_dict() for entry in entries if getattr(entry, "state", "ok") == "ok"]


def _server_metrics(pool: ModelPool) -> Any:
    """The server's :class:`~anyformer.server._metrics.ServerMetrics`; None without prometheus-client (no /metrics)."""
    try:
        from anyformer.server._metrics import ServerMetrics
    except ImportError:
        return None
    return ServerMetrics(pool)


def _chat_page() -> str:
    return resources.files("anyformer.server").joinpath("static/chat.html").read_text(encoding="utf-8")


def create_app(
    pool: ModelPool | None = None,
    *,
    api_key: str | None = None,
    preload: list[str] | None = None,
    models: Sequence[str] = (),
    allow_paths: Sequence[str | os.PathLike[str]] = (),
    allow_pull: bool = False,
    allowed_hosts: Sequence[str] = (),
    cors_origins: Sequence[str] = (),
    bind_host: str | None = None,
    max_body: int = DEFAULT_MAX_BODY_BYTES,
) -> Starlette:
    """The server as an ASGI application.

    ``pool`` holds the models (default: a :class:`ModelPool` with the probe's budget); ``api_key``
    makes ``/v1/*`` and ``/api/*`` require ``Authorization: Bearer KEY``; ``preload`` lists models
    to load at start-up. What clients may name: ``models`` and ``preload``, the store's models,
    local paths inside ``allow_paths``, any Hub id with ``allow_pull`` (:class:`ModelAccess`).
    Browsers: ``allowed_hosts`` are ``Host`` names besides loopback and ``bind_host``;
    ``cors_origins`` are origins besides the server's own that may call it, with CORS headers.
    ``max_body`` bounds a request body in bytes.
    """
    pool = pool or ModelPool()
    access = ModelAccess(
        [*models, *(preload or ())],
        stored=lambda: _stored_models(pool.plugins),
        allow_paths=allow_paths,
        allow_pull=allow_pull,
    )
    api = _Api(pool, access, max_body)
    ps = PsRoutes(pool)
    page = _chat_page()
    page_security = page_headers(page)
    expected_key = f"Bearer {api_key}".encode() if api_key else None

    async def index(request: Request) -> HTMLResponse:
        return HTMLResponse(page, headers=page_security)

    async def health(request: Request) -> JSONResponse:
        """Up or not for anyone; what is loaded only for a caller with the key (when there is one)."""
        given = request.headers.get("authorization", "").encode("latin-1", "replace")
        if expected_key is not None and not hmac.compare_digest(given, expected_key):
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "ok", "loaded": [m["id"] for m in pool.loaded()], "time": time.time()})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        install_shortage_log(asyncio.get_running_loop())
        for ref in preload or ():
            await pool.preload(loadable(ref))
        try:
            yield
        finally:
            await pool.close()

    routes = [
        Route("/", index),
        Route("/health", health),
        Route("/v1/models", api.models),
        Route("/v1/models/{model_id:path}", api.retrieve),
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/embeddings", api.embeddings, methods=["POST"]),
        Route("/v1/audio/transcriptions", api.transcriptions, methods=["POST"]),
        Route("/api/check", api.check),
        Route("/api/ps", ps.ps),
        Route("/api/stop", ps.stop, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(resources.files("anyformer.server") / "static")), name="static"),
    ]
    metrics = _server_metrics(pool)
    if metrics is not None:
        routes.append(Route("/metrics", metrics.endpoint))

    async def on_anyformer_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, (AnyformerError, ApiError))
        return error_response(exc)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = "NOT_FOUND" if exc.status_code == 404 else "METHOD_NOT_ALLOWED" if exc.status_code == 405 else "HTTP"
        return error_response(ApiError(exc.status_code, code, f"{request.method} {request.url.path}: {exc.detail}"))

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        # Still OpenAI's shape, and no exception text: it may hold paths or a client's input.
        return error_response(
            ApiError(500, "INTERNAL_ERROR", f"the server failed on this request ({type(exc).__name__})")
        )

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            AnyformerError: on_anyformer_error,
            ApiError: on_anyformer_error,
            HTTPException: on_http_error,
            Exception: on_unexpected,
        },
    )
    # Added innermost first: the guard runs first, then CORS (so a preflight needs no key), then the key.
    if api_key:
        app.add_middleware(_ApiKeyMiddleware, api_key=api_key)
    if cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(RequestGuard, allowed_hosts=allowed_hosts, cors_origins=cors_origins, bind_host=bind_host)
    # Outermost: a refusal by the guard or the key is logged and counted too.
    app.add_middleware(RequestObserver, routes=routes, observe=metrics.observe if metrics is not None else None)
    app.add_middleware(AmbiguousFramingGuard)
    app.state.pool = pool
    app.state.access = access
    return app


class _ApiKeyMiddleware:
    """Refuses ``/v1/*`` and ``/api/*`` requests without ``Authorization: Bearer KEY`` (401)."""

    def __init__(self, app: Callable[..., Awaitable[None]], api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(_PROTECTED_PREFIXES):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                response = error_response(
                    ApiError(401, "UNAUTHORIZED", "a valid API key is needed: send Authorization: Bearer KEY")
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
