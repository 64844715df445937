"""Running the server with uvicorn."""

from __future__ import annotations

from collections.abc import Sequence

from anyformer.server._app import create_app
from anyformer.server._pool import DEFAULT_QUEUE_SIZE, ModelPool


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    budget: int | str | None = None,
    preload: Sequence[str] = (),
    api_key: str | None = None,
    queue_size: int = DEFAULT_QUEUE_SIZE,
    context: int | None = None,
    isolate: bool | None = None,
    log_level: str = "info",
) -> None:
    """Serve until interrupted: the pool within ``budget``, ``preload`` loaded at start-up.

    ``isolate`` runs each engine in its own worker process (None: whenever ``anyformer.load`` can).
    """
    import uvicorn

    pool = ModelPool(budget=budget, queue_size=queue_size, context=context, isolate=isolate)
    app = create_app(pool, api_key=api_key, preload=list(preload))
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
