"""``host:port`` endpoints of RPC servers, from an argument, a list or ``ANYFORMER_RPC``."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from anyformer.contract._errors import AnyformerError, ErrorCode

#: The environment variable that names RPC servers when a call names none (comma-separated).
RPC_ENV = "ANYFORMER_RPC"
#: As many servers as llama.cpp's RPC backend takes (GGML_RPC_MAX_SERVERS).
MAX_SERVERS = 16
#: An IPv4 address or a host name: llama.cpp's RPC client connects over IPv4 only (AF_INET, gethostbyname).
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}$")


def parse_endpoint(text: str) -> str:
    """One ``host:port`` (an IPv4 address or a host name), normalised; ``BAD_REQUEST`` for anything else."""
    value = text.strip() if isinstance(text, str) else text
    if not isinstance(value, str) or ":" not in value:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"an RPC server is host:port, got {text!r}")
    host, _, port = value.rpartition(":")
    if host.startswith("[") or host.count(":"):
        raise AnyformerError(
            ErrorCode.BAD_REQUEST, f"llama.cpp's RPC client connects over IPv4 only: use an IPv4 address, got {text!r}"
        )
    if not _HOST.match(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"an RPC server is host:port (port 1-65535), got {text!r}")
    return f"{host}:{int(port)}"


def parse_endpoints(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """Endpoints from a comma-separated string or a list; empty for None or ""; duplicates refused."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    endpoints = tuple(parse_endpoint(item) for item in items if not (isinstance(item, str) and not item.strip()))
    if len(set(endpoints)) != len(endpoints):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"an RPC server is named twice: {', '.join(endpoints)}")
    if len(endpoints) > MAX_SERVERS:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"at most {MAX_SERVERS} RPC servers, got {len(endpoints)}")
    return endpoints


def endpoints_from_env() -> tuple[str, ...]:
    """The servers ``ANYFORMER_RPC`` names (``host:port,host:port``), or none."""
    return parse_endpoints(os.environ.get(RPC_ENV))


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``(host, port)`` of a parsed endpoint."""
    host, _, port = endpoint.rpartition(":")
    return host, int(port)
