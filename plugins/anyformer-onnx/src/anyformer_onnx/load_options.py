"""The ONNX backend's load options: the schema the core parses ``Request.options`` with for it."""

from __future__ import annotations

from anyformer.plugin import LoadOption, LoadOptions
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
