"""What ``can_run`` reads from a model's description: the GGUF it would load and what that takes.

Nothing here opens a file: the core's ``describe`` already read the GGUF's header into
``model.metadata["gguf"]`` (architecture, dims, weight types, tokenizer, data bytes).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from anyformer import Model, ModelFile

#: Context a model loads with when the request names none (capped by what it was trained on).
DEFAULT_CONTEXT = 4096
#: Most tokens one prefill step covers (the activation buffers are sized for this many).
MAX_BATCH = 32
#: Host memory the engine takes besides the mapped file: tokenizer, Python objects, staging buffers.
RAM_OVERHEAD = 96 * 10**6

_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class GgufChoice:
    """The GGUF a load would read and the header facts describe found in it."""

    file: ModelFile
    summary: dict[str, Any]


def choose_gguf(model: Model) -> GgufChoice | str:
    """The language-model GGUF described in ``model.metadata``, or a one-line reason there is none to run."""
    ggufs = [f for f in model.files_of("gguf") if "mmproj" not in f.name.lower()]
    if not ggufs:
        return "no language-model GGUF (only projectors)"
    name = model.metadata.get("gguf_file")
    chosen = model.file(name) if isinstance(name, str) else (ggufs[0] if len(ggufs) == 1 else None)
    summary = model.metadata.get("gguf")
    if chosen is None or not isinstance(summary, dict):
        return "the GGUF's header was not read (no header facts in the description)"
    if _SPLIT.search(chosen.name) or summary.get("split"):
        return f"{chosen.name} is one shard of a split set, which this engine does not read"
    return GgufChoice(chosen, summary)


def context_for(summary: dict[str, Any], requested: int | None) -> int:
    """The context a load uses: the request's (capped by the model's own), else the default capped too."""
    trained = summary.get("context_length")
    limit = trained if isinstance(trained, int) and not isinstance(trained, bool) and trained > 0 else None
    wanted = requested or DEFAULT_CONTEXT
    return min(wanted, limit) if limit else wanted
