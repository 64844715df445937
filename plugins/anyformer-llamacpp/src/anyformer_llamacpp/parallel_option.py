"""The ``parallel`` and ``flash_attention`` load options, and how many streams fit in memory.

Apart from the slots themselves (``_slots``), which need numpy: choosing a backend imports this
module in every ``anyformer`` command, and numpy's import (~50 ms) belongs to the process that
loads the model, not to the one that only chooses.
"""

from __future__ import annotations

from collections.abc import Callable

from anyformer.plugin import AnyformerError, ErrorCode

#: The most streams one loaded model serves at once (llama.cpp's own limit is 256 sequences).
MAX_PARALLEL = 64


def parallel_option(options: dict[str, object]) -> int:
    """The ``parallel`` load option: how many streams to serve at once (1 when absent).

    ``BAD_REQUEST`` for anything but a whole number from 1 to :data:`MAX_PARALLEL`.
    """
    value = options.get("parallel", 1)
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARALLEL:
        raise AnyformerError(
            ErrorCode.BAD_REQUEST,
            f"the parallel option must be a whole number of streams from 1 to {MAX_PARALLEL}, got {value!r}",
        )
    return value


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
    """The ``flash_attention`` load option: llama.cpp's fused attention, on unless ``False`` is given (absent or None: on).

    The one-stream and the batched engine both read it (the batched context copies the one-stream
    load's settings), so a reply under load stays the reply alone. On the 2-core CPU it cut a
    decoded token of SmolLM2 by 4 % alone and 11 % in a batch of 4, and llama-server turns it on by
    default too ("auto"); ``False`` gives llama-cpp-python's default kernels back, whose near-ties
    break differently (docs/backends/llamacpp.md). ``BAD_REQUEST`` for anything but a boolean.
    """
    value = options.get("flash_attention", True)
    if value is None:
        return True
    if not isinstance(value, bool):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"the flash_attention option must be true or false, got {value!r}")
    return value
