"""What ``can_run`` reads from a model's description: the context a load takes and what that costs.

Nothing here opens a file: the core's ``describe`` already read the GGUF's header into
``model.metadata["gguf"]`` (architecture, dims, weight types, tokenizer, data bytes).
"""

from __future__ import annotations

import os
from typing import Any

from anyformer.plugin import Caps

#: Context a model loads with when the request names none (capped by what it was trained on).
DEFAULT_CONTEXT = 4096
#: Most tokens one prefill step covers (the activation buffers are sized for this many).
MAX_BATCH = 64
#: Host memory the engine takes besides the mapped file: tokenizer, Python objects, staging buffers.
RAM_OVERHEAD = 96 * 10**6


def context_for(summary: dict[str, Any], requested: int | None) -> int:
    """The context a load uses: the request's (capped by the model's own), else the default capped too."""
    trained = summary.get("context_length")
    limit = trained if isinstance(trained, int) and not isinstance(trained, bool) and trained > 0 else None
    wanted = requested or DEFAULT_CONTEXT
    return min(wanted, limit) if limit else wanted


def modelled_speed(summary: dict[str, Any], caps: Caps, *, estimated: bool) -> tuple[float | None, str]:
    """The decode tok/s the engine is modelled to reach on this machine's adapter, and how (or why none).

    The adapter's kernel costs are timed once in a child process and kept (anyformer-gguf-gpu's
    ``adapter_speed``); the first ``check`` on a new adapter or driver pays that (a few seconds).
    A what-if about another machine's GPU (caps naming another adapter) gets no figure, nor does a file
    whose header was not read (``estimated``: its summary is rebuilt from the file size and config.json).
    """
    if estimated:
        return None, "no header read: the shapes are guesses"
    if not summary.get("block_count"):
        return None, "the header gives no layer count"
    from anyformer_gguf_gpu.adapter_speed import adapter_speed
    from anyformer_gguf_gpu.decode_speed import decode_speed, formats_read

    allow_software = os.environ.get("ANYFORMER_SOFTWARE_GPU") == "1"
    try:
        speed = adapter_speed(allow_software, formats_read(summary))
    except Exception as exc:  # an adapter that cannot be timed keeps its verdict; the reason says why
        return None, f"timing the adapter failed ({type(exc).__name__}: {str(exc)[:120]})"
    if caps.gpu_name and speed.adapter != caps.gpu_name:
        return None, f"the adapter timed here is {speed.adapter}, not {caps.gpu_name}"
    found = decode_speed(summary, speed, kv_f16=caps.f16)
    if found is None:
        return None, "the header lacks the layer count, or the adapter's kernels gave no rate"
    return round(found.tok_per_sec, 1), found.why()
