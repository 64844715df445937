"""The ONNX backend's load options: the schema the core parses ``Request.options`` with for it, and the
readers every task uses (``provider``, ``precision``, ``threads``, ``fuse_attention``)."""

from __future__ import annotations

from typing import Any

from anyformer.plugin import LoadOption, LoadOptions, Request
from anyformer_onnx.graphs import PRECISIONS

LOAD_OPTIONS = LoadOptions(
    LoadOption(
        "precision",
        "enum",
        None,
        "the graphs' precision (default: the best the provider runs)",
        tuple(dict.fromkeys(PRECISIONS.values())),
    ),
    LoadOption("provider", "enum", None, "cpu forces the CPU (default: CUDA where it is there)", ("cuda", "cpu")),
    LoadOption("threads", "int", None, "intra-op threads (default: ANYFORMER_ONNX_THREADS, or every core)", minimum=1),
    LoadOption("fuse_attention", "bool", True, "rewrite a decoder's attention into fused CPU kernels"),
)


def fuse_option(request: Request) -> bool:
    """The ``fuse_attention`` option (default True): rewrite a decoder's attention for the CPU."""
    return bool(LOAD_OPTIONS.value(request.options, "fuse_attention"))


def string_option(request: Request, key: str) -> str | None:
    """The ``provider`` or ``precision`` option (None when absent), parsed by the schema."""
    value: str | None = LOAD_OPTIONS.value(request.options, key)
    return value


def option(request: Request, key: str) -> Any:
    """Any of the options, parsed by the schema (``threads``: an int or None)."""
    return LOAD_OPTIONS.value(request.options, key)
