"""Errors in OpenAI's JSON shape, with anyformer's codes and the HTTP status each one maps to.

Messages to clients carry no server paths: every absolute path in an error (a cache folder, a
model's file, a verdict's reason) is cut to its last component (``…/model.gguf``).
"""

from __future__ import annotations

import re
from typing import Any

from starlette.responses import JSONResponse

from anyformer.contract._errors import AnyformerError, ErrorCode

#: The HTTP status of each anyformer error code.
STATUS_BY_CODE: dict[ErrorCode, int] = {
    ErrorCode.NO_BACKEND: 400,
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.UNSAFE_FORMAT: 400,
    ErrorCode.MODEL_NOT_FOUND: 404,
    ErrorCode.BAD_MODEL: 422,
    ErrorCode.CANCELLED: 499,
    ErrorCode.BUSY: 503,
    ErrorCode.OFFLINE: 503,
    ErrorCode.DOWNLOAD_FAILED: 502,
    ErrorCode.BUDGET_TOO_SMALL: 507,
    ErrorCode.DISK_FULL: 507,
    ErrorCode.OUT_OF_MEMORY: 507,
    ErrorCode.BACKEND_CRASHED: 500,
    ErrorCode.PLUGIN_ERROR: 500,
}

#: Seconds a client is told to wait before retrying a request refused with 503.
RETRY_AFTER_SECONDS = 1


class ApiError(Exception):
    """An HTTP-level refusal that has no anyformer code of its own (a wrong API key, an unknown route)."""

    def __init__(self, status: int, code: str, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param


def _error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 404:
        return "not_found_error"
    if status in (429, 503):
        return "rate_limit_error" if status == 429 else "overloaded_error"
    return "invalid_request_error" if status < 500 else "server_error"


#: An absolute path: POSIX (not the ``//`` of a URL) or a Windows drive, up to the next space or quote.
_ABSOLUTE_PATH = re.compile(r"(?<![\w:/.~-])(?:/|~/|[A-Za-z]:[\\/])[^\s'\"`,;()<>\[\]{}]*")


#: URL paths of this server, which messages name and which are no secret.
_OWN_ROUTES = ("/v1/", "/api/", "/health")


def redact_paths(text: str) -> str:
    """``text`` with each absolute path cut to ``…/`` and its last component."""

    def cut(match: re.Match[str]) -> str:
        if match.group(0).startswith(_OWN_ROUTES) or match.group(0) == "/":
            return match.group(0)  # the server's own URL paths, as in "GET /v1/models lists them"
        path = match.group(0).rstrip(".:")
        tail = match.group(0)[len(path) :]
        last = re.split(r"[\\/]", path.rstrip("/\\"))[-1]
        return f"…/{last}{tail}" if last else f"…{tail}"

    return _ABSOLUTE_PATH.sub(cut, text)


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact_paths(value)
    if isinstance(value, list):
        return [_redacted(item) for item in value]
    if isinstance(value, dict):
        return {key: _redacted(item) for key, item in value.items()}
    return value


def error_body(status: int, code: str, message: str, *, param: str | None = None, **extra: Any) -> dict[str, Any]:
    """``{"error": {"message", "type", "code", "param", ...}}``; ``extra`` adds fields such as ``need``.

    Paths in the message and in ``extra`` (verdicts' reasons) are redacted.
    """
    error: dict[str, Any] = {"message": message, "type": _error_type(status), "code": code, "param": param}
    error.update({key: value for key, value in extra.items() if value is not None})
    return {"error": _redacted(error)}


def status_of(exc: AnyformerError) -> int:
    """The HTTP status for an anyformer error."""
    return STATUS_BY_CODE.get(exc.code, 500)


def anyformer_error_body(exc: AnyformerError) -> dict[str, Any]:
    """An anyformer error as OpenAI's error object; ``need`` and ``verdicts`` ride along when set."""
    verdicts = [v.to_dict() for v in exc.verdicts] if exc.verdicts else None
    param = getattr(exc, "param", None)
    return error_body(status_of(exc), exc.code.value, exc.message, param=param, need=exc.need, verdicts=verdicts)


def error_response(exc: AnyformerError | ApiError) -> JSONResponse:
    """The JSON response for an error, with ``Retry-After`` on 503 and ``WWW-Authenticate`` on 401."""
    if isinstance(exc, ApiError):
        status, body = exc.status, error_body(exc.status, exc.code, exc.message, param=exc.param)
    else:
        status, body = status_of(exc), anyformer_error_body(exc)
    headers = {}
    if status == 503:
        headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(body, status_code=status, headers=headers)


def bad_request(message: str, param: str | None = None) -> AnyformerError:
    """A ``BAD_REQUEST`` error naming the request field at fault (OpenAI's ``param``)."""
    exc = AnyformerError(ErrorCode.BAD_REQUEST, message)
    exc.param = param  # type: ignore[attr-defined]
    return exc
