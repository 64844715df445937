"""diskformer's load options declared: the schema the core parses ``Request.options`` with for it.

Imports nothing of the engine: ``anyformer check`` reads it with the plugin module. The
``cache_policy`` choices are the policies' names and ``prompt_step``'s default is the GPU layout's
(a test holds them equal to ``cache.policies.POLICY_NAMES`` and ``engines.gpu.layout.PROMPT_STEP``).
:mod:`~anyformer_diskformer.load_options` reads the values for the engine.
"""

from __future__ import annotations

from anyformer.plugin import FILE_OPTION, LoadOption, LoadOptions

LOAD_OPTIONS = LoadOptions(
    FILE_OPTION,
    LoadOption("device", "enum", "auto", "auto: a GPU when wgpu finds one, else the CPU", ("auto", "cpu", "gpu")),
    LoadOption("pool_bytes", "size", None, "bytes of the expert cache (default: what the budget leaves)", minimum=1),
    LoadOption("cache_policy", "enum", "reuse", "the expert cache's eviction policy", ("reuse", "lrfu", "lru")),
    LoadOption("prefetch", "int", None, "experts a layer read ahead (default: the model's top-k; 0: none)", minimum=0),
    LoadOption("prefetch_threads", "int", 2, "reader threads of the prefetcher", minimum=0),
    LoadOption("threads", "int", None, "CPU compute threads (default: the cores, up to 4)", minimum=1),
    LoadOption("direct_io", "bool", True, "O_DIRECT reads where allowed; no: pread and POSIX_FADV_DONTNEED"),
    LoadOption("prime", "str", None, "a system prompt to run and checkpoint at load"),
    LoadOption("prompt_step", "int", 32, "GPU: most prompt tokens a step", minimum=1),
    LoadOption("cpu_experts", "bool", False, "GPU: compute the experts the cache misses on the CPU"),
)
