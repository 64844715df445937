"""Running the server with uvicorn."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from anyformer.server._app import DEFAULT_MAX_BODY_BYTES, create_app
from anyformer.server._keep_alive import DEFAULT_KEEP_ALIVE
from anyformer.server._pool import DEFAULT_PARALLEL, DEFAULT_QUEUE_SIZE, ModelPool


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    budget: int | str | None = None,
    preload: Sequence[str] = (),
    api_key: str | None = None,
    queue_size: int = DEFAULT_QUEUE_SIZE,
    context: int | None = None,
    parallel: int | Literal["auto"] = DEFAULT_PARALLEL,
    isolate: bool | None = None,
    log_level: str = "info",
    models: Sequence[str] = (),
    allow_paths: Sequence[str] = (),
    allow_pull: bool = False,
    allowed_hosts: Sequence[str] = (),
    cors_origins: Sequence[str] = (),
    max_body: int = DEFAULT_MAX_BODY_BYTES,
    keep_alive: float = DEFAULT_KEEP_ALIVE,
    log_file: str | None = None,
) -> None:
    """Serve until interrupted: the pool within ``budget``, ``preload`` loaded at start-up.

    ``isolate`` runs each engine in its own worker process (None: whenever ``anyformer.load`` can);
    ``parallel`` is how many requests one model serves at once where its backend batches (llama.cpp).
    What clients may name and which browsers may call: see :func:`create_app`. ``keep_alive`` is how
    many seconds an idle model stays loaded; one line per request goes to ``log_file`` (else stderr)
    at ``log_level``.
    """
    import uvicorn

    from anyformer.server._request_log import configure_logging

    configure_logging(log_level, log_file)
    pool = ModelPool(
        budget=budget,
        queue_size=queue_size,
        context=context,
        parallel=parallel,
        isolate=isolate,
        keep_alive=keep_alive,
    )
    app = create_app(
        pool,
        api_key=api_key,
        preload=list(preload),
        models=models,
        allow_paths=allow_paths,
        allow_pull=allow_pull,
        allowed_hosts=allowed_hosts,
        cors_origins=cors_origins,
        bind_host=host,
        max_body=max_body,
    )
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
