"""diskformer's load options (``request.options``) read and checked: ``BAD_REQUEST`` naming the option.

The cache's size (``pool_bytes``), the GPU's prompt step, the prefetcher's width and threads, the CPU's
compute threads, ``cpu_experts`` and the eviction policy.
"""

from __future__ import annotations

import os

from anyformer.plugin import AnyformerError, ErrorCode, Request, format_size
from anyformer_diskformer.cache.policies import EvictionPolicy, make_policy
from anyformer_diskformer.engines.gpu.layout import PROMPT_STEP


def cache_capacity(request: Request, min_cache: int, budget_cache: int, need: int) -> int:
    """The expert cache's bytes: ``pool_bytes`` when the request names it, else what host memory leaves.

    Below one layer's top-k experts is ``BUDGET_TOO_SMALL`` with the budget that would do.
    """
    pool = request.options.get("pool_bytes")
    if pool is not None:
        if not isinstance(pool, int) or isinstance(pool, bool) or pool <= 0:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"pool_bytes must be a positive integer, not {pool!r}")
        if pool < min_cache:
            raise AnyformerError(
                ErrorCode.BUDGET_TOO_SMALL,
                f"pool_bytes {format_size(pool)} is below one layer's top-k experts ({format_size(min_cache)})",
                need=need,
            )
        return pool
    if budget_cache < min_cache:
        raise AnyformerError(
            ErrorCode.BUDGET_TOO_SMALL,
            f"free memory leaves {format_size(max(0, budget_cache))} for experts; one layer's top-k experts take "
            f"{format_size(min_cache)} (the whole load needs {format_size(need)})",
            need=need,
        )
    return budget_cache


def _count_option(options: dict[str, object], name: str, default: int) -> int:
    value = options.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{name} must be a whole number of at least 0, not {value!r}")
    return value


def prompt_step_option(options: dict[str, object]) -> int:
    """Most tokens a GPU prompt step covers: the ``prompt_step`` load option (default
    :data:`~anyformer_diskformer.plan.PROMPT_STEP`; 1 runs prompts a token a step)."""
    value = _count_option(options, "prompt_step", PROMPT_STEP)
    if value < 1:
        raise AnyformerError(ErrorCode.BAD_REQUEST, "prompt_step must be at least 1")
    return value


def prefetch_options(options: dict[str, object], top_k: int) -> tuple[int, int]:
    """(experts a layer to read ahead, reader threads) from the ``prefetch`` (default: the top-k; 0: none)
    and ``prefetch_threads`` (default 2) load options; ``BAD_REQUEST`` for anything but whole numbers."""
    return _count_option(options, "prefetch", top_k), _count_option(options, "prefetch_threads", 2)


def compute_threads(options: dict[str, object]) -> int:
    """Threads the CPU engine computes a layer's experts on: the ``threads`` load option, else the machine's cores
    up to 4 (experts are few per layer; more threads than that mostly wait)."""
    default = max(1, min(4, os.cpu_count() or 1))
    value = _count_option(options, "threads", default)
    if value < 1:
        raise AnyformerError(ErrorCode.BAD_REQUEST, "threads must be at least 1")
    return value


def cpu_experts_option(options: dict[str, object]) -> bool:
    """The ``cpu_experts`` load option (default False): whether the GPU engine computes the experts its cache
    misses on the CPU while decoding instead of uploading them; ``BAD_REQUEST`` for anything but a bool."""
    value = options.get("cpu_experts", False)
    if not isinstance(value, bool):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"cpu_experts must be true or false, not {value!r}")
    return value


def policy_for(options: dict[str, object], n_layer: int) -> EvictionPolicy:
    """The eviction policy the ``cache_policy`` load option names (``reuse``, the default, ``lrfu`` or ``lru``)."""
    # reuse by default: it keeps the experts each layer chooses most often and lets a newly read expert
    # displace one only when it is more likely to be used again; on recorded and skewed synthetic traces it
    # is the closest of the three to Belady's optimum (see the docs' figures).
    name = options.get("cache_policy", "reuse")
    try:
        return make_policy(str(name), n_layer)
    except ValueError as exc:
        raise AnyformerError(ErrorCode.BAD_REQUEST, str(exc)) from exc
