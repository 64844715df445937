"""The one ``store`` check: an accepted load whose files must be downloaded where the store cannot take them.

The core runs it on every accepting verdict, from the files its estimate names (``Estimate.files``),
so no backend repeats it: a Hub file not in the cache yet needs a writable store (``caps.store``)
and, where the probe knows it, room on the store's disk (``caps.disk_free_bytes``).
"""

from __future__ import annotations

from anyformer.contract._caps import Caps
from anyformer.contract._model import Model
from anyformer.contract._sizes import format_size
from anyformer.contract._verdict import Refusal, Verdict
from anyformer.store._store import files_to_download


def store_refusal(verdict: Verdict, model: Model, caps: Caps) -> Verdict | None:
    """A ``store`` refusal for ``verdict``'s backend when its files must be downloaded and cannot be, else None."""
    if not verdict.ok or verdict.estimate is None or model.source != "hub" or not verdict.estimate.files:
        return None
    missing = files_to_download(model, verdict.estimate.files)
    if not missing:
        return None
    first = missing[0].name if len(missing) == 1 else f"{missing[0].name} and {len(missing) - 1} more files"
    download = sum(entry.size or 0 for entry in missing)
    if not caps.store:
        where = f" ({caps.store_path})" if caps.store_path else ""
        return Verdict.refuse(
            verdict.backend,
            Refusal.STORE,
            f"{first} ({format_size(download)}) must be downloaded and the model store{where} is not writable",
        )
    if caps.disk_free_bytes is not None and download > caps.disk_free_bytes:
        return Verdict.refuse(
            verdict.backend,
            Refusal.STORE,
            f"{first} ({format_size(download)}) must be downloaded and the store's disk has "
            f"{format_size(caps.disk_free_bytes)} free",
        )
    return None
