"""A decoder graph with its attention fused, made once on the first load, proven, and kept in anyformer's cache.

The rewrite itself is :mod:`rewrite.attention_fusion` (after :mod:`rewrite.cache_branch` reduces optimum's merged
decoder to its with-past branch; then :mod:`rewrite.norm_fusion` and :mod:`rewrite.mlp_fusion`). Here: where the
result lives, when it is made again, and the proof that it computes what the exported graph computes.

- Where: ``ANYFORMER_HOME/onnx/<org>/<name>/fused/<key>/`` for a Hub model (``anyformer rm``
  removes it with the model), ``ANYFORMER_HOME/onnx/local/fused/<key>/`` for a local folder;
  never the model's own folder. ``model.onnx`` with its weights in ``model.onnx.data``, and
  ``fusion.json`` saying what was done or why not (a graph that cannot be fused is not read again
  on every load).
- Key: the graph file's and its external data files' resolved path, size, modification time and
  inode, config.json, the onnxruntime version and :data:`FUSION_VERSION`: a changed model or a
  new rewrite makes a new folder.
- Atomic: written into a ``.partial`` folder of this process and renamed into place when complete;
  a reader never sees half a graph, and two processes loading at once both end with one folder.
- Proof: the exported graph and the fused one run the same probe (a prompt of seeded token ids,
  then greedy decode steps) with every ``MatMulNBits`` node at accuracy level 1 (fp32 arithmetic;
  level 4 quantises activations to int8, which turns the last bits of any reordering into visible
  noise; the levels are put back before the graph is saved). The fused graph is used only when
  every logit is within :data:`TOLERANCE` of the exported graph's (relative to the largest logit)
  and every step picks the same token; otherwise the exported graph is, and ``fusion.json``
  records the difference. (Graphs that quantise activations with ``DynamicQuantizeLinear`` run the
  probe as they are: their proof is as close as the rounding of that quantisation allows.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from anyformer.plugin import (
    ProgressCallback,
    ProgressEvent,
    anyformer_home,
    check_onnx_external_data,
    format_size,
    host_ram_available,
    read_onnx_summary,
)
from anyformer_onnx import BACKEND_ID
from anyformer_onnx.rewrite.attention_fusion import NotFusable, attention_shape, fuse_attention
from anyformer_onnx.rewrite.cache_branch import reduce_to_with_past
from anyformer_onnx.rewrite.fused_store import DATA_NAME, GRAPH_NAME, RECORD_NAME, cache_folder
from anyformer_onnx.rewrite.mlp_fusion import split_gate_up
from anyformer_onnx.rewrite.norm_fusion import fuse_norms

#: Bumped when the rewrite changes, so graphs fused by an older one are made again.
FUSION_VERSION = 7
#: Largest |fused − exported| logit allowed, relative to the largest |logit| (fp32 graphs). The
#: rewrite reorders fp32 sums (softmax and the two attention products): measured on SmolLM2 2.5e-5
#: on logits of ~28 (1e-6 relative). A wrong rotary table, scale or mask moves logits by a good
#: fraction of their size, so 1e-3 tells the two apart with margin on both sides.
TOLERANCE = 1e-3
#: The same for graphs computing in float16 (a 10-bit mantissa: ~1e-3 per rounding).
TOLERANCE_FP16 = 2e-2
#: Graphs whose weights are larger than this are not rewritten: the proof builds sessions from
#: protobufs in memory, which protobuf caps at 2 GiB.
MAX_BYTES = 1_900_000_000
#: Memory the first load needs to fuse, in graph sizes (the graph, its serialised copy, a session on it).
BUILD_MEMORY_FACTOR = 4
#: Tokens of the probe prompt, and decode steps after it.
PROBE_PROMPT, PROBE_STEPS = 7, 3
#: A ``.partial`` folder untouched this long is an interrupted build's (a running build writes within seconds).
STALE_SECONDS = 3600
#: The first load's progress message while the rewrite runs.
FUSING = "fusing attention for the CPU (first load only)"


@dataclasses.dataclass(frozen=True)
class PreparedGraph:
    """The graph to open and what was done to it (``note`` goes to the loaded handle's details)."""

    path: Path
    fused: bool
    note: str


def _identity(path: Path) -> dict[str, Any]:
    resolved = path.resolve()
    stat = resolved.stat()
    return {"path": str(resolved), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "inode": stat.st_ino}


def _sources(graph: Path) -> list[Path]:
    """The graph file and the external data files it names (already validated by the caller)."""
    locations = read_onnx_summary(graph).external_locations
    return [graph, *sorted({graph.parent / location for location in locations})]


def cache_key(graph: Path, config: Mapping[str, Any]) -> str:
    """The cache folder's name for ``graph``: a hash of its files' identity, config, onnxruntime and the rewrite."""
    import onnxruntime

    facts = {
        "files": [_identity(p) for p in _sources(graph)],
        "config": dict(config),
        "onnxruntime": onnxruntime.__version__,
        "fusion": FUSION_VERSION,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def prepare_decoder(
    graph: Path,
    config: Mapping[str, Any],
    *,
    repo: str | None,
    context: int,
    progress: ProgressCallback,
    label: str,
    file: str | None = None,
) -> PreparedGraph:
    """The fused graph for ``graph`` (made and proven on the first load), or ``graph`` itself with the reason.

    ``file`` names the graph in the progress events (stage ``fuse``, shown on the first load only).
    Runs the core's ONNX validator on ``graph`` before anything reads it (``BAD_MODEL``).
    """
    check_onnx_external_data(graph)
    try:
        shape = attention_shape(config, context)
    except NotFusable as exc:
        return PreparedGraph(graph, False, f"as exported ({exc})")
    if context > shape.positions:
        return PreparedGraph(graph, False, f"as exported (context {context} > {shape.positions} rotary positions)")
    size = sum(p.stat().st_size for p in _sources(graph))
    if size > MAX_BYTES:
        return PreparedGraph(graph, False, "as exported (over 1.9 GB: the rewrite is not proven in memory)")
    folder = cache_folder(repo, cache_key(graph, config))
    record = _read_record(folder)
    if record is None:
        home = anyformer_home()
        home.mkdir(parents=True, exist_ok=True)
        if shutil.disk_usage(home).free < 2 * size:
            return PreparedGraph(graph, False, f"as exported (less than {2 * size} bytes free under {home})")
        available = host_ram_available()
        if available and available < BUILD_MEMORY_FACTOR * size:
            # The graph in memory, its serialised copy for the probe session, and that session.
            return PreparedGraph(
                graph, False, f"as exported ({format_size(available)} of memory free: too little to fuse)"
            )
        shown = file or graph.name
        progress(ProgressEvent(stage="fuse", backend=BACKEND_ID, file=shown, total=1, message=FUSING))
        try:
            record = _build(graph, config, folder, label, context)
        except OSError as exc:  # a full disk or a read-only home: the export still runs
            return PreparedGraph(graph, False, f"as exported (the fused graph could not be written: {exc})")
        except Exception as exc:  # a graph onnx cannot read: open_session reports it as BAD_MODEL
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return PreparedGraph(graph, False, f"as exported (not rewritten: {text[:200]})")
        progress(ProgressEvent(stage="fuse", backend=BACKEND_ID, file=shown, done=1, total=1, message=record["note"]))
    if record.get("fused") and (folder / GRAPH_NAME).is_file():
        return PreparedGraph(folder / GRAPH_NAME, True, str(record["note"]))
    return PreparedGraph(graph, False, str(record.get("note", "as exported")))


def _read_record(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / RECORD_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _build(graph: Path, config: Mapping[str, Any], folder: Path, label: str, context: int) -> dict[str, Any]:
    """Fuse, prove and write ``folder`` (atomically); returns its record."""
    import onnx

    started = time.monotonic()
    model = onnx.load(str(graph))
    record: dict[str, Any]
    try:
        reference = _exact_probe(model, config)
        reduced = reduce_to_with_past(model)
        report = fuse_attention(model, config, context)
        norms = fuse_norms(model, config)
        splits = split_gate_up(model, config)
        fused = _exact_probe(model, config)
    except NotFusable as exc:
        record = {"fused": False, "note": f"as exported ({exc})"}
    except MemoryError:
        raise  # not the graph's fault: nothing is recorded, a later load tries again
    except Exception as exc:  # onnxruntime refusing a probe's graph: keep the exported one
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        record = {"fused": False, "note": f"as exported (the probe failed: {text[:200]})"}
    else:
        scale = max(1.0, max(float(np.abs(r).max()) for r in reference))
        difference = max(float(np.abs(a - b).max()) for a, b in zip(reference, fused, strict=True))
        limit = (TOLERANCE_FP16 if _half(model) else TOLERANCE) * scale
        if difference <= limit and all(a.argmax() == b.argmax() for a, b in zip(reference, fused, strict=True)):
            note = (
                ("merged decoder reduced to its with-past branch, " if reduced else "")
                + f"attention fused into GroupQueryAttention ({report.layers} layers, q/k/v packed in "
                f"{report.packed_qkv}, {norms} norms fused, "
                + (f"gate/up chunk split in {splits}, " if splits else "")
                + f"{report.nodes_before} → {len(model.graph.node)} nodes; "
                f"logits within {difference:.1e} of the export)"
            )
            record = {"fused": True, "note": note, "difference": difference, "limit": limit}
        else:
            record = {
                "fused": False,
                "note": f"as exported (the fused graph's logits differ by {difference:.3g} > {limit:.3g})",
                "difference": difference,
                "limit": limit,
            }
    record.update(seconds=round(time.monotonic() - started, 1), source=os.path.abspath(graph), label=label)
    partial = folder.with_name(f".{folder.name}.{os.getpid()}.{threading.get_ident()}.partial")
    _remove_stale_partials(folder)
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        if record["fused"]:
            onnx.save_model(
                model,
                str(partial / GRAPH_NAME),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=DATA_NAME,
                size_threshold=1024,
            )
        (partial / RECORD_NAME).write_text(json.dumps(record, indent=1), encoding="utf-8")
        with contextlib.suppress(OSError):  # another process put the same folder in place first
            os.replace(partial, folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return _read_record(folder) or record


def _remove_stale_partials(folder: Path) -> None:
    """Delete what an interrupted build of ``folder`` left (``.partial`` folders untouched for an hour)."""
    if not folder.parent.is_dir():
        return
    for stale in folder.parent.glob(f".{folder.name}.*.partial"):
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > STALE_SECONDS:
                shutil.rmtree(stale, ignore_errors=True)


def _exact_probe(model: Any, config: Mapping[str, Any]) -> list[np.ndarray]:
    """:func:`_probe` with every MatMulNBits at accuracy level 1 (fp32 compute), the levels put back after."""
    changed = []
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for attribute in node.attribute:
                if attribute.name == "accuracy_level" and attribute.i != 1:
                    changed.append((attribute, attribute.i))
                    attribute.i = 1
    try:
        return _probe(model, config)
    finally:
        for attribute, level in changed:
            attribute.i = level


def _half(model: Any) -> bool:
    return any(i.name.startswith("past_key_values.") and i.type.tensor_type.elem_type == 10 for i in model.graph.input)


def _probe(model: Any, config: Mapping[str, Any]) -> list[np.ndarray]:
    """The last-position logits of a seeded prompt and of the decode steps after it (greedy on the first graph)."""
    import onnxruntime

    from anyformer_onnx.chat.decoder import DecodeLoop, DecoderGraph

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
    )
    loop = DecodeLoop(DecoderGraph(session, config, "probe"), "cpu")
    vocabulary = config.get("vocab_size")
    vocabulary = vocabulary if isinstance(vocabulary, int) and vocabulary > 1 else 2
    ids = [int(i) for i in np.random.default_rng(0).integers(0, vocabulary, PROBE_PROMPT)]
    rows, cache, total = [], loop.empty_cache(), 0
    for _ in range(PROBE_STEPS + 1):
        total += len(ids)
        row, cache = loop.step(ids, total, cache)
        rows.append(row)
        ids = [int(row.argmax())]
    return rows
