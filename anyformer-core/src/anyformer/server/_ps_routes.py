"""``GET /api/ps`` and ``POST /api/stop``: what the server holds, and unloading a model (``anyformer ps``/``stop``).

Both sit under ``/api/``, so they need the API key when the server has one.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.server._errors import bad_request
from anyformer.server._pool import ModelPool
from anyformer.server._schemas import MAX_MODEL_CHARS

#: The largest ``/api/stop`` body read (it names one model).
_STOP_BODY_LIMIT = 16 * 1024


class PsRoutes:
    """The two routes over one pool."""

    def __init__(self, pool: ModelPool) -> None:
        self.pool = pool

    async def ps(self, request: Request) -> JSONResponse:
        """``GET /api/ps``: each loaded model's backend, memory, context, streams and when it will be unloaded."""
        return JSONResponse({"models": self.pool.loaded(), "queued": self.pool.queued()})

    async def stop(self, request: Request) -> JSONResponse:
        """``POST /api/stop {"model": ID}``: unload it now, or once its running requests end; 404 when not loaded."""
        body = await request.body()
        if len(body) > _STOP_BODY_LIMIT:
            raise bad_request(f"the body is over {_STOP_BODY_LIMIT:,} bytes; it names one model")
        model = _model_of(body)
        stopped = await self.pool.stop(model)
        if not stopped:
            loaded = ", ".join(item["id"] for item in self.pool.loaded()) or "none"
            raise AnyformerError(ErrorCode.MODEL_NOT_FOUND, f"{model} is not loaded (loaded: {loaded})")
        return JSONResponse({"model": model, "stopped": stopped})


def _model_of(body: bytes) -> str:
    try:
        parsed: Any = json.loads(body or b"{}")
    except ValueError:
        raise bad_request('the body must be JSON: {"model": ID}') from None
    model = parsed.get("model") if isinstance(parsed, dict) else None
    if not isinstance(model, str) or not model.strip():
        raise bad_request('give {"model": ID}, an id GET /api/ps lists', "model")
    if len(model) > MAX_MODEL_CHARS:
        raise bad_request(f"'model' is {len(model):,} characters; at most {MAX_MODEL_CHARS} are read", "model")
    return model.strip()
