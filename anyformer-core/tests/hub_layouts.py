"""Real Hub repo layouts (``tests/data/hub_layouts/*.json``) served by :class:`FakeHub` with tiny stand-ins.

Each data file is one real repo's listing as a public page showed it (file names with folders,
sizes, tags, pipeline tag, library) and the facts its stand-in headers need (architecture and
hyperparameters), with its source and which sizes are real. :func:`serve_layout` adds the repo to a
hub at those sizes: every GGUF gets a valid header written with gguf's writer (the architecture's
keys, a tokenizer vocabulary, a tensor list whose ggml types follow the quant its name states and
whose data fits the listed size), config.json is the listed config, safetensors get a valid header,
and everything after a header reads as zeros (a :class:`StandIn`: nothing multi-GB is ever held).

The ``checks`` of a data file say what ``anyformer check`` should answer on that repo for a given
machine (test_hub_layouts.py asserts them, scripts/hub_layouts_table.py tabulates them).

Test support for the core's tests; see docs/hub-layouts.md for the table.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import math
import re
import struct
from pathlib import Path
from typing import Any

from hub_server import FakeHub, StandIn

__all__ = [
    "LAYOUT_DIR",
    "Layout",
    "LayoutCheck",
    "gguf_header",
    "load_layouts",
    "quant_in_name",
    "serve_layout",
    "stand_in_files",
]

LAYOUT_DIR = Path(__file__).parent / "data" / "hub_layouts"

_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
# A quant as publishers spell it in a file name, anywhere in the stem ("gemma-4-26B_q4_0-it.gguf").
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])(?:UD-)?(IQ\d_(?:XXS|XS|S|M|NL)|Q\d_K(?:_(?:XXL|XL|S|M|L))?|Q\d_\d|TQ\d_\d|MXFP4(?:_MOE)?"
    r"|BF16|FP16|F16|F32)(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"


@dataclasses.dataclass(frozen=True)
class LayoutFile:
    """One file of a listing: repo-relative name, size in bytes, and whether that size is estimated."""

    name: str
    size: int
    estimated: bool


@dataclasses.dataclass(frozen=True)
class LayoutCheck:
    """One ``anyformer check`` question on a layout and what the issue expects it to answer.

    ``machine`` holds ``caps`` (``--caps`` flags), ``ram``, ``budget`` and ``gpu_bytes`` as the CLI
    spells sizes; ``chosen`` is the backend the policy should choose (None: none can run it);
    ``verdicts`` maps a backend to ``{"file": first file of its estimate}`` or ``{"refusal": code}``,
    either with ``"pending": reason`` while the branch it waits for has not landed.
    """

    name: str
    machine: dict[str, Any]
    chosen: str | None
    chosen_pending: str | None
    verdicts: dict[str, dict[str, str]]


@dataclasses.dataclass(frozen=True)
class Layout:
    """One real repo's listing and the facts its stand-in contents are written from."""

    key: str
    repo: str
    sources: tuple[str, ...]
    sizes: str
    pipeline_tag: str | None
    library_name: str | None
    tags: tuple[str, ...]
    model: dict[str, Any]
    config: dict[str, Any] | None
    files: tuple[LayoutFile, ...]
    checks: tuple[LayoutCheck, ...]

    @property
    def real_sizes(self) -> bool:
        """True when no file's size in the listing is an estimate."""
        return not any(f.estimated for f in self.files)


def load_layouts(folder: Path = LAYOUT_DIR) -> list[Layout]:
    """Every layout in ``folder``, sorted by file name."""
    return [_layout(path) for path in sorted(folder.glob("*.json"))]


def _layout(path: Path) -> Layout:
    data = json.loads(path.read_text(encoding="utf-8"))
    files = tuple(
        LayoutFile(entry[0], int(entry[1]), len(entry) > 2 and entry[2] == "estimated") for entry in data["files"]
    )
    checks = tuple(
        LayoutCheck(
            name=check["name"],
            machine=check.get("machine", {}),
            chosen=check.get("chosen"),
            chosen_pending=check.get("chosen_pending"),
            verdicts=check.get("verdicts", {}),
        )
        for check in data.get("checks", [])
    )
    return Layout(
        key=path.stem,
        repo=data["repo"],
        sources=tuple(data["sources"]),
        sizes=data["sizes"],
        pipeline_tag=data.get("pipeline_tag"),
        library_name=data.get("library_name"),
        tags=tuple(data.get("tags", [])),
        model=data.get("model", {}),
        config=data.get("config"),
        files=files,
        checks=checks,
    )


def serve_layout(hub: FakeHub, layout: Layout, revision: str = "main") -> str:
    """Add ``layout`` to ``hub`` at its listed sizes as ``revision``; return the commit sha.

    Each revision is its own commit: a check asked at a revision of its own starts as a new
    process would, with nothing of another check's header reads cached or counted for that commit.
    """
    return hub.add_repo(
        layout.repo,
        stand_in_files(layout),
        revision=revision,
        pipeline_tag=layout.pipeline_tag,
        tags=list(layout.tags),
        library_name=layout.library_name,
        lfs_suffixes=(".gguf", ".onnx", ".onnx_data", ".safetensors", ".bin", ".data", ".pth"),
    )


#: Stand-ins already written, per layout key: a header with a 250k-token vocabulary takes a moment.
_WRITTEN: dict[str, dict[str, StandIn]] = {}


def stand_in_files(layout: Layout) -> dict[str, StandIn]:
    """The stand-in of every file of ``layout`` (written once per process)."""
    if layout.key not in _WRITTEN:
        _WRITTEN[layout.key] = _stand_ins(layout)
    return dict(_WRITTEN[layout.key])


def _stand_ins(layout: Layout) -> dict[str, StandIn]:
    out: dict[str, StandIn] = {}
    shards = _split_sets(layout.files)
    for entry in layout.files:
        name, size = entry.name, entry.size
        lower = name.lower()
        if lower.endswith(".gguf"):
            if "mmproj" in lower.rsplit("/", 1)[-1]:
                prefix = _projector_header(size)
            else:
                prefix = _shard_prefix(layout, entry, shards)
            out[name] = StandIn(prefix, size)
        elif lower.endswith(".safetensors"):
            out[name] = StandIn(_safetensors_header(size), size)
        elif name == "config.json" and layout.config is not None:
            out[name] = _text(json.dumps(layout.config, indent=2).encode(), size)
        elif lower.endswith("readme.md"):
            out[name] = _text(_model_card(layout), size)
        elif lower.endswith(".json"):
            out[name] = _text(b"{}", size)
        elif lower.endswith((".onnx", ".onnx_data", ".data", ".bin", ".pth")) or "onnx_data" in lower:
            out[name] = StandIn(b"", size)
        else:
            out[name] = _text(b"", size)
    return out


def _text(content: bytes, size: int) -> StandIn:
    # A listed size smaller than the stand-in's own text keeps the text (the size is then a few bytes off).
    return StandIn(content, max(size, len(content)), fill=b" ")


def _model_card(layout: Layout) -> bytes:
    lines = ["---"]
    if layout.pipeline_tag:
        lines.append(f"pipeline_tag: {layout.pipeline_tag}")
    if layout.library_name:
        lines.append(f"library_name: {layout.library_name}")
    if layout.tags:
        lines.append("tags:")
        lines.extend(f"- {tag}" for tag in layout.tags)
    lines += ["---", "", f"# {layout.repo} (stand-in)", ""]
    return "\n".join(lines).encode()


def quant_in_name(name: str) -> str | None:
    """The quant a GGUF's file name states (``UD-Q4_K_XL`` -> ``Q4_K_XL``, ``fp16`` -> ``F16``), or None."""
    stem = name.rsplit("/", 1)[-1]
    stem = _SPLIT.sub("", stem)
    stem = re.sub(r"\.gguf$", "", stem, flags=re.IGNORECASE)
    found = _QUANT.findall(stem)
    if not found:
        return None
    quant = found[-1].upper()
    return "F16" if quant == "FP16" else quant


# -- GGUF headers -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Types:
    """The ggml type names a quant gives each kind of tensor (llama.cpp's recipes, simplified)."""

    main: str
    attn_v: str
    ffn_down: str
    output: str
    embd: str
    attn: str | None = None  # q, k, output of attention when the recipe raises them (unsloth's UD)


def _recipe(quant: str | None) -> _Types:
    """What tensors of a file at ``quant`` are stored as (a name stating no quant reads as Q8_0)."""
    q = quant or "Q8_0"
    if q in ("F16", "BF16", "F32"):
        return _Types(q, q, q, q, q)
    if q.startswith("MXFP4"):
        return _Types("MXFP4", "Q8_0", "MXFP4", "Q8_0", "Q8_0", attn="Q8_0")
    if q.endswith(("_XL", "_XXL")):
        base = _recipe(q.rsplit("_", 1)[0] + "_M" if q.startswith(("Q2", "Q3", "Q4", "Q5")) else q.split("_")[0])
        return _Types(base.main, "Q8_0", base.ffn_down, "Q8_0", "Q6_K", attn="Q8_0")
    k = re.fullmatch(r"Q(\d)_K(?:_([SML]))?", q)
    if k:
        bits, size = int(k.group(1)), k.group(2) or "M"
        main = f"Q{bits}_K"
        raised = f"Q{min(bits + 2, 6)}_K" if size in ("M", "L") else main
        output = "Q8_0" if size == "L" else "Q6_K"
        return _Types(main, raised, raised if bits >= 4 else main, output, "Q8_0" if size == "L" else main)
    if re.fullmatch(r"Q\d_\d", q):
        return _Types(q, q, q, "Q8_0" if q == "Q8_0" else "Q6_K", q)
    iq = {"IQ3_M": "IQ3_S", "IQ3_XS": "IQ3_S", "IQ2_M": "IQ2_S"}.get(q, q)
    if iq.startswith(("IQ", "TQ")):
        return _Types(iq, "Q4_K", iq, "Q6_K", "Q4_K" if iq.startswith("IQ4") else "Q2_K")
    return _Types("Q8_0", "Q8_0", "Q8_0", "Q8_0", "Q8_0")


def _fit_type(type_name: str, first_dim: int) -> str:
    """``type_name`` where a row of ``first_dim`` values holds whole blocks of it, else what llama.cpp falls back to."""
    import gguf

    block, _ = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    if first_dim % block == 0:
        return type_name
    return "Q8_0" if first_dim % 32 == 0 else "F16"


def _nbytes(type_name: str, shape: tuple[int, ...]) -> int:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    return math.prod(shape) // block * size


def _tensor_list(
    model: dict[str, Any], quant: str | None, shrink: float = 1.0
) -> list[tuple[str, tuple[int, ...], str]]:
    """``(name, numpy shape, ggml type)`` of every tensor of a file at ``quant``: the architecture's
    usual tensors (attention, a dense or expert FFN, norms in F32) at the model's dimensions, with
    the FFN widths scaled by ``shrink`` (to fit a listed size smaller than the real dimensions)."""
    types = _recipe(quant)
    n_embd = int(model["embedding_length"])
    n_vocab = int(model["vocab_size"])
    n_head = int(model["head_count"])
    n_kv = int(model.get("head_count_kv", n_head))
    head_dim = int(model.get("key_length", n_embd // n_head))
    experts = int(model.get("expert_count", 0))

    def width(value: int) -> int:
        return max(256, int(value * shrink) // 256 * 256) if shrink < 1.0 else value

    n_ff = width(int(model.get("feed_forward_length", 4 * n_embd)))
    n_ff_exp = width(int(model.get("expert_feed_forward_length", n_ff)))
    n_ff_shexp = (
        width(int(model.get("expert_shared_feed_forward_length", 0)))
        if model.get("expert_shared_feed_forward_length")
        else 0
    )
    conv_layers = set(model.get("shortconv_layers", []))
    out: list[tuple[str, tuple[int, ...], str]] = []

    def add(name: str, shape: tuple[int, ...], type_name: str) -> None:
        out.append((name, shape, _fit_type(type_name, shape[-1])))

    add("token_embd.weight", (n_vocab, n_embd), types.embd)
    for i in range(int(model["block_count"])):
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", (n_embd,), "F32"))
        if i in conv_layers:
            out.append((p + "shortconv.conv.weight", (n_embd, 3), "F32"))
            add(p + "shortconv.in_proj.weight", (3 * n_embd, n_embd), types.attn or types.main)
            add(p + "shortconv.out_proj.weight", (n_embd, n_embd), types.attn or types.main)
        else:
            add(p + "attn_q.weight", (n_head * head_dim, n_embd), types.attn or types.main)
            add(p + "attn_k.weight", (n_kv * head_dim, n_embd), types.attn or types.main)
            add(p + "attn_v.weight", (n_kv * head_dim, n_embd), types.attn_v)
            add(p + "attn_output.weight", (n_embd, n_head * head_dim), types.attn or types.main)
        out.append((p + "ffn_norm.weight", (n_embd,), "F32"))
        if experts:
            out.append((p + "ffn_gate_inp.weight", (experts, n_embd), "F32"))
            add(p + "ffn_gate_exps.weight", (experts, n_ff_exp, n_embd), types.main)
            add(p + "ffn_up_exps.weight", (experts, n_ff_exp, n_embd), types.main)
            add(p + "ffn_down_exps.weight", (experts, n_embd, n_ff_exp), types.ffn_down)
            if n_ff_shexp:
                add(p + "ffn_gate_shexp.weight", (n_ff_shexp, n_embd), types.attn or types.main)
                add(p + "ffn_up_shexp.weight", (n_ff_shexp, n_embd), types.attn or types.main)
                add(p + "ffn_down_shexp.weight", (n_embd, n_ff_shexp), types.ffn_down)
        else:
            add(p + "ffn_gate.weight", (n_ff, n_embd), types.main)
            add(p + "ffn_up.weight", (n_ff, n_embd), types.main)
            add(p + "ffn_down.weight", (n_embd, n_ff), types.ffn_down)
    out.append(("output_norm.weight", (n_embd,), "F32"))
    if not model.get("tied_embeddings"):
        add("output.weight", (n_vocab, n_embd), types.output)
    return out


def _split_sets(files: tuple[LayoutFile, ...]) -> dict[str, list[LayoutFile]]:
    """Each split set's shards in order, keyed by the name of its first shard."""
    sets: dict[str, dict[int, LayoutFile]] = {}
    for entry in files:
        match = _SPLIT.search(entry.name)
        if match:
            base = entry.name[: match.start()] + f"-of-{match.group(2)}"
            sets.setdefault(base, {})[int(match.group(1))] = entry
    return {parts[min(parts)].name: [parts[i] for i in sorted(parts)] for parts in sets.values()}


def _shard_prefix(layout: Layout, entry: LayoutFile, sets: dict[str, list[LayoutFile]]) -> bytes:
    """The header of one GGUF (or of one shard of a split set: its share of the set's tensors)."""
    shards = next((s for s in sets.values() if entry in s), [entry])
    split = len(shards) > 1
    quant = quant_in_name(shards[0].name)
    total = sum(s.size for s in shards)
    arch = layout.model["architecture"]
    shrink = 1.0
    while True:
        tensors = _tensor_list(layout.model, quant, shrink)
        need = sum(_aligned(_nbytes(t, shape)) for _, shape, t in tensors)
        # Headers take a few MB at most (the vocabulary): leave room for one per shard.
        if need + len(shards) * 8 * 1024 * 1024 <= total or shrink < 0.05:
            break
        shrink *= 0.8
    # Tensors go to the shards in order, each shard taking what its listed size holds.
    portions: list[list[tuple[str, tuple[int, ...], str]]] = [[] for _ in shards]
    room = [s.size - 8 * 1024 * 1024 for s in shards]
    shard = 0
    for tensor in tensors:
        nbytes = _aligned(_nbytes(tensor[2], tensor[1]))
        while shard < len(shards) - 1 and room[shard] < nbytes and portions[shard]:
            shard += 1
        portions[shard].append(tensor)
        room[shard] -= nbytes
    index = shards.index(entry)
    return gguf_header(
        arch,
        layout.model,
        portions[index],
        quant,
        first=index == 0,
        split=(index, len(shards), len(tensors)) if split else None,
    )


def _aligned(n: int, alignment: int = 32) -> int:
    return (n + alignment - 1) // alignment * alignment


def gguf_header(
    arch: str,
    model: dict[str, Any],
    tensors: list[tuple[str, tuple[int, ...], str]],
    quant: str | None,
    *,
    first: bool = True,
    split: tuple[int, int, int] | None = None,
) -> bytes:
    """The bytes of a GGUF header (magic, key/values, tensor infos) for these tensors, data not included.

    ``first`` carries the model's key/values and vocabulary (later shards of a split set carry only
    the ``split.*`` keys, as ``llama-gguf-split`` writes them); ``split`` is ``(index, count, tensors)``.
    """
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(None, arch)
    if not first:
        writer.kv_data = [{}]  # a later shard names no architecture: only the split keys
    if first:
        _model_keys(writer, arch, model, quant)
    if split is not None:
        writer.add_uint16("split.no", split[0])
        writer.add_uint16("split.count", split[1])
        writer.add_int32("split.tensors.count", split[2])
    for name, shape, type_name in tensors:
        ggml_type = gguf.GGMLQuantizationType[type_name]
        writer.add_tensor_info(name, shape, np.dtype(np.float32), _nbytes(type_name, shape), raw_dtype=ggml_type)
    return _header_bytes(writer, int(model["vocab_size"]) if first else 0)


def _header_bytes(writer: Any, vocab: int = 0) -> bytes:
    """What ``writer`` would write before the tensor data, written to memory (it only opens paths
    itself), with a ``vocab``-token ``tokenizer.ggml.tokens`` array appended to its key/values."""
    from gguf.gguf_writer import WriterState

    buffer = io.BytesIO()
    writer.fout = [buffer]
    writer.state = WriterState.EMPTY
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    kv_end = buffer.tell()
    writer.write_ti_data_to_file()
    data = buffer.getvalue()
    if not vocab:
        return data
    # The magic, version and tensor count, then one key/value more than the writer counted.
    (count,) = struct.unpack_from("<Q", data, 16)
    return data[:16] + struct.pack("<Q", count + 1) + data[24:kv_end] + _token_list(vocab) + data[kv_end:]


@functools.lru_cache(maxsize=8)
def _token_list(vocab: int) -> bytes:
    """The ``tokenizer.ggml.tokens`` key/value of a ``vocab``-token vocabulary, packed once per size
    (the writer packs a 250k-token list in seconds, once per file)."""
    key = b"tokenizer.ggml.tokens"
    string, array = 8, 9  # GGUFValueType.STRING, GGUFValueType.ARRAY
    parts = [struct.pack("<Q", len(key)), key, struct.pack("<IIQ", array, string, vocab)]
    for i in range(vocab):
        token = b"t%d" % i
        parts.append(struct.pack("<Q", len(token)))
        parts.append(token)
    return b"".join(parts)


def _model_keys(writer: Any, arch: str, model: dict[str, Any], quant: str | None) -> None:
    import gguf

    writer.add_name(model.get("name", arch))
    file_type = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16"}.get(quant or "", f"MOSTLY_{quant}")
    if file_type in gguf.LlamaFileType.__members__:
        writer.add_file_type(gguf.LlamaFileType[file_type].value)
    writer.add_block_count(int(model["block_count"]))
    writer.add_context_length(int(model.get("context_length", 4096)))
    writer.add_embedding_length(int(model["embedding_length"]))
    writer.add_feed_forward_length(int(model.get("feed_forward_length", 4 * int(model["embedding_length"]))))
    writer.add_head_count(int(model["head_count"]))
    writer.add_head_count_kv(int(model.get("head_count_kv", model["head_count"])))
    if "key_length" in model:
        writer.add_key_length(int(model["key_length"]))
        writer.add_value_length(int(model["key_length"]))
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(float(model.get("rope_freq_base", 10000.0)))
    if model.get("expert_count"):
        writer.add_expert_count(int(model["expert_count"]))
        writer.add_expert_used_count(int(model["expert_used_count"]))
        writer.add_expert_feed_forward_length(int(model.get("expert_feed_forward_length", 0)))
        if model.get("expert_shared_feed_forward_length"):
            writer.add_expert_shared_feed_forward_length(int(model["expert_shared_feed_forward_length"]))
    for key, value in model.get("extra_kv", {}).items():
        # Architecture keys the engines read beyond the common ones (Ling's gating function, say).
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_string(key, str(value))
    writer.add_tokenizer_model(model.get("tokenizer_model", "gpt2"))
    if model.get("tokenizer_pre"):
        writer.add_tokenizer_pre(model["tokenizer_pre"])
    if model.get("tokenizer_model", "gpt2") == "gpt2":
        writer.add_token_merges(["t 1", "t 2"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(_TEMPLATE)


def _projector_header(size: int) -> bytes:
    """A vision projector's header (``clip``): a patch embedding and a few blocks, F16."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(None, "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", "mlp")
    width = 1024
    per_block = _nbytes("F16", (width, width)) * 4
    blocks = max(1, min(48, (size - 4 * 1024 * 1024) // per_block))
    writer.add_uint32("clip.vision.block_count", blocks)
    writer.add_uint32("clip.vision.embedding_length", width)
    for i in range(blocks):
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            name = f"v.blk.{i}.{part}.weight"
            writer.add_tensor_info(name, (width, width), np.dtype(np.float16), _nbytes("F16", (width, width)))
    return _header_bytes(writer)


def _safetensors_header(size: int) -> bytes:
    """A valid safetensors header whose one U8 tensor fills the rest of a ``size``-byte file."""
    length = 0
    for _ in range(4):  # the header's own length is part of the arithmetic; it settles at once
        data = size - 8 - length
        header = json.dumps(
            {"__metadata__": {"format": "pt"}, "weight": {"dtype": "U8", "shape": [data], "data_offsets": [0, data]}}
        ).encode()
        header += b" " * ((8 - len(header) % 8) % 8)
        if len(header) == length:
            break
        length = len(header)
    return struct.pack("<Q", len(header)) + header
