"""The ``parallel`` and ``flash_attention`` load options, and how many streams fit in memory.

Apart from the slots themselves (``_slots``), which need numpy: choosing a backend imports this
module in every ``anyformer`` command, and numpy's import (~50 ms) belongs to the process that
loads the model, not to the one that only chooses.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Literal

from anyformer.plugin import usable_cpu_count
from anyformer_llamacpp.load_options import LOAD_OPTIONS, MAX_PARALLEL

__all__ = ["MAX_PARALLEL", "flash_attention", "parallel_option", "pick_threads", "streams_for"]
#: ``parallel="auto"``: as many streams as suit the machine (:func:`streams_for`).
AUTO: Literal["auto"] = "auto"
#: Streams the automatic choice plans per decode thread, and the most it plans.
AUTO_PER_THREAD = 2
AUTO_MAX = 16


def pick_threads(options: dict[str, object] | None = None) -> int:
    """Threads for decoding: the ``threads`` load option, else every core this process may use.

    Measured on the 2-core machine with SmolLM2-135M: 1 thread ~75 tok/s (llama-cpp-python's
    default of half the cores), 2 threads ~94 tok/s; on the 16-core H200 host 16 threads beat 2
    by 3x. ``ANYFORMER_LLAMACPP_THREADS`` overrides the core count.
    """
    asked = LOAD_OPTIONS.value(options or {}, "threads")
    if asked is not None:
        return int(asked)
    override = os.environ.get("ANYFORMER_LLAMACPP_THREADS")
    if override and override.isdigit() and int(override) > 0:
        return int(override)
    return usable_cpu_count()


def parallel_option(options: dict[str, object]) -> int | Literal["auto"]:
    """The ``parallel`` load option: how many streams to serve at once (1 when absent), or ``"auto"``.

    ``BAD_REQUEST`` for anything but ``"auto"`` or a whole number from 1 to :data:`MAX_PARALLEL`
    (the schema in :mod:`anyformer_llamacpp.load_options`).
    """
    value = LOAD_OPTIONS.value(options, "parallel")
    return AUTO if value == AUTO else int(value)


def auto_streams(threads: int) -> int:
    """The streams ``parallel="auto"`` asks for before memory is counted: 2 per decode thread, 2 to 16.

    On a CPU a batched step costs about as much per token as a one-stream step (the quantised
    products are compute-bound: 7.0-7.6 against 6.6-6.8 ms a token at 1 thread on the 2-core
    machine), so more streams than the cores can keep busy add no tokens per second, only slow
    each stream down; 2 per thread keep a decode step's batch full while one stream reads its
    prompt or a client sends its next request (4 on 2 cores, where 4 streams did 1.25-1.9x the
    serialised server and llama-server's own default is 4).
    """
    return max(2, min(AUTO_MAX, AUTO_PER_THREAD * threads))


def streams_for(options: dict[str, object], ram_bytes: int, host_bytes_for: Callable[[int], int], threads: int) -> int:
    """How many streams to load: the ``parallel`` option's, as many as the host memory ``ram_bytes`` holds.

    A number asked for is cut to what fits (:func:`streams_that_fit`). ``"auto"`` takes
    :func:`auto_streams` of the decode ``threads`` and cuts it to what fits in half of ``ram_bytes``:
    each stream's KV region is allocated when the model loads, whether or not a client ever uses
    it, so the default leaves the other half to the system and to the other models a server loads.
    """
    asked = parallel_option(options)
    if isinstance(asked, str):  # "auto"
        return streams_that_fit(auto_streams(threads), ram_bytes // 2, host_bytes_for)
    return streams_that_fit(asked, ram_bytes, host_bytes_for)


def streams_that_fit(requested: int, ram_bytes: int, host_bytes_for: Callable[[int], int]) -> int:
    """The most streams, up to ``requested`` and at least 1, whose host memory (``host_bytes_for(n)``) fits.

    Each stream has a KV region of the whole context, so a server's default of several streams
    must not refuse a model that one stream runs: it gets as many as the memory holds.
    """
    streams = requested
    while streams > 1 and host_bytes_for(streams) > ram_bytes:
        streams -= 1
    return streams


def flash_attention(options: dict[str, object]) -> bool:
    """The ``flash_attention`` load option: llama.cpp's fused attention, on unless ``False`` is given.

    The one-stream and the batched engine both read it (the batched context copies the one-stream
    load's settings), so a reply under load stays the reply alone. On the 2-core CPU it cut a
    decoded token of SmolLM2 by 4 % alone and 11 % in a batch of 4, and llama-server turns it on by
    default too ("auto"); ``False`` gives llama-cpp-python's default kernels back, whose near-ties
    break differently (docs/backends/llamacpp.md). ``BAD_REQUEST`` for anything but a yes or no.
    """
    return bool(LOAD_OPTIONS.value(options, "flash_attention"))
