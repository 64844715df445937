"""One-line texts for people: verdicts and estimates."""

from __future__ import annotations

from anyformer.contract._sizes import format_size
from anyformer.contract._verdict import Verdict


def describe_verdict_line(verdict: Verdict) -> str:
    """``llamacpp: format (no GGUF in the repo)`` or ``llamacpp: ok, 105 MB RAM, 75 tok/s``."""
    if not verdict.ok:
        need = f", need {format_size(verdict.need)}" if verdict.need is not None else ""
        return f"{verdict.backend}: {verdict.code} ({verdict.reason}{need})"
    return f"{verdict.backend}: ok, {describe_estimate(verdict)}"


def describe_estimate(verdict: Verdict) -> str:
    """The estimate's memory and speed in a few words, the file it would load, and whether it is rough."""
    est = verdict.estimate
    if est is None:
        return ""
    parts = []
    if est.gpu_bytes:
        parts.append(f"{format_size(est.gpu_bytes)} GPU")
    parts.append(f"{format_size(est.ram_bytes)} RAM")
    if est.disk_bytes:
        parts.append(f"{format_size(est.disk_bytes)} disk")
    if est.tok_per_sec is not None:
        parts.append(f"~{est.tok_per_sec:g} tok/s")
    file = est.details.get("file")
    if isinstance(file, str) and file:
        parts.append(f"file {file}")
    if est.details.get("estimated") is True:
        parts.append("rough estimate (no header read)")
    return ", ".join(parts)
