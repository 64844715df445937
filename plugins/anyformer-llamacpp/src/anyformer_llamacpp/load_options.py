"""The llama.cpp backend's load options: the schema the core parses ``Request.options`` with for it."""

from __future__ import annotations

from anyformer.plugin import FILE_OPTION, LoadOption, LoadOptions

#: The most streams one loaded model serves at once (llama.cpp's own limit is 256 sequences).
MAX_PARALLEL = 64

LOAD_OPTIONS = LoadOptions(
    FILE_OPTION,
    LoadOption(
        "parallel",
        "int",
        1,
        "streams served at once, batched in one decode step; auto: as many as suit the machine",
        minimum=1,
        maximum=MAX_PARALLEL,
        words=("auto",),
    ),
    LoadOption(
        "threads", "int", None, "decode threads (default: every usable core, or ANYFORMER_LLAMACPP_THREADS)", minimum=1
    ),
    LoadOption("flash_attention", "bool", True, "llama.cpp's fused attention kernels"),
    LoadOption(
        "special_in_content", "bool", False, "parse special tokens in message text as control tokens (default: text)"
    ),
)
