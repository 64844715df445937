"""Running the server with uvicorn."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.server._app import DEFAULT_MAX_BODY_BYTES, create_app
from anyformer.server._connections import DEFAULT_MAX_CONNECTIONS, guarded_protocol
from anyformer.server._guard import is_loopback
from anyformer.server._keep_alive import DEFAULT_KEEP_ALIVE
from anyformer.server._pool import DEFAULT_PARALLEL, DEFAULT_QUEUE_SIZE, ModelPool


def check_bind(host: str, api_key: str | None, insecure_no_key: bool = False) -> None:
    """Refuse to listen beyond this machine without an API key (``BAD_REQUEST``) unless ``insecure_no_key``.

    Every address but a loopback one (``0.0.0.0``, ``::``, a LAN address) lets other machines in,
    and then anyone on the network can use the models and the machine's memory.
    """
    name = host.strip().strip("[]").lower()
    if api_key or insecure_no_key or (name and is_loopback(name)):
        return
    raise AnyformerError(
        ErrorCode.BAD_REQUEST,
        f"--host {host or '(every address)'} lets other machines in, and no --api-key is set: give one "
        "(or $ANYFORMER_API_KEY), or --insecure-no-key to serve the network without one",
    )


def server_config(
    app: Any, host: str, port: int, *, max_connections: int = DEFAULT_MAX_CONNECTIONS, **more: Any
) -> Any:
    """The uvicorn configuration the server runs with: its own h11 protocol (head deadline, connection cap)."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, http=guarded_protocol(max_connections), **more)


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
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    special_in_content: bool = False,
    insecure_no_key: bool = False,
    options: Mapping[str, Any] | None = None,
) -> None:
    """Serve until interrupted: the pool within ``budget``, ``preload`` loaded at start-up.

    ``isolate`` runs each engine in its own worker process (None: whenever ``anyformer.load`` can);
    ``parallel`` is how many requests one model serves at once where its backend batches (llama.cpp).
    What clients may name and which browsers may call: see :func:`create_app`. ``keep_alive`` is how
    many seconds an idle model stays loaded; one line per request goes to ``log_file`` (else stderr)
    at ``log_level``. At most ``max_connections`` connections are open at once;
    ``special_in_content`` has backends parse special tokens in message text (off: they are text); a
    non-loopback ``host`` needs ``api_key`` unless ``insecure_no_key`` (:func:`check_bind`). ``options`` are
    load options every load and check asks for (``--option KEY=VALUE``), parsed by the core against the
    backends' schemas: a backend that lacks one is refused for the model (``option``).
    """
    import uvicorn

    from anyformer.server._request_log import configure_logging

    check_bind(host, api_key, insecure_no_key)
    configure_logging(log_level, log_file)
    asked = {**(options or {}), **({"special_in_content": True} if special_in_content else {})}
    if asked:  # a key no backend takes, or a bad value, stops the server before it starts, not at a request
        from anyformer._plugins import get_plugin_manager
        from anyformer.contract._request import Request

        get_plugin_manager().check_load_options(Request(options=asked))
    pool = ModelPool(
        budget=budget,
        queue_size=queue_size,
        context=context,
        parallel=parallel,
        isolate=isolate,
        keep_alive=keep_alive,
        options=asked or None,
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
    protocol = guarded_protocol(max_connections)
    uvicorn.run(app, host=host, port=port, http=protocol, log_level=log_level, timeout_graceful_shutdown=5)
