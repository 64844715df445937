"""What ``can_run`` reads from a model's description: the context a load takes and what that costs.

Nothing here opens a file: the core's ``describe`` already read the GGUF's header into
``model.metadata["gguf"]`` (architecture, dims, weight types, tokenizer, data bytes).
"""

from __future__ import annotations

from typing import Any

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
