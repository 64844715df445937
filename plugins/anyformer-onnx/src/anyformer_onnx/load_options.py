"""The load options every task reads (``provider``, ``precision``, ``fuse_attention``), checked as they are read."""

from __future__ import annotations

from anyformer.plugin import AnyformerError, ErrorCode, Request


def fuse_option(request: Request) -> bool:
    """The ``fuse_attention`` option (default True): rewrite a decoder's attention for the CPU."""
    value = request.options.get("fuse_attention", True)
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    if not isinstance(value, bool):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"the fuse_attention option must be true or false, got {value!r}")
    return value


def string_option(request: Request, key: str) -> str | None:
    """The ``key`` option as a string (None when absent); ``BAD_REQUEST`` for any other type."""
    value = request.options.get(key)
    if value is not None and not isinstance(value, str):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"the {key} option must be a string, got {value!r}")
    return value
