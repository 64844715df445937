"""The fault corpus: every G, S, O, T and P row of docs/safety.md as files on disk, in several seeds.

Each :class:`Fault` is a small tree of files (a model and what it points at) and the outcome its
row states. A seed varies the honest part around the fault (how many keys and tensors, their
names, types and shapes, where the fault sits) so that a check that only works on one layout
fails on another. Built on :mod:`hostile_files`, byte by byte; no model library is used.

    for fault in corpus(seeds=3): path = fault.write(tmp_path); ...
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path

from hostile_files import (
    ARRAY,
    F32,
    GGML_F16,
    GGML_F32,
    GGML_Q8_0,
    STRING,
    U8,
    U32,
    U64,
    Tensor,
    array_payload,
    gguf_str,
    kv,
    kv_array,
    kv_raw,
    make_gguf,
    make_safetensors,
    nested_arrays,
    onnx_graph,
    onnx_model,
    onnx_tensor,
    split_shard,
    u32,
    u64,
)

#: What a row's input must produce.
BAD_MODEL = "BAD_MODEL"  # describe raises BAD_MODEL
ACCEPTED_OR_BAD_MODEL = "ACCEPTED_OR_BAD_MODEL"  # describe returns or raises BAD_MODEL, nothing else (G14)
ACCEPTED = "ACCEPTED"  # describe returns (a legitimate layout, or a fault another layer catches)
TEMPLATE_REFUSED = "TEMPLATE_REFUSED"  # describe returns; rendering the chat template is BAD_MODEL (G16)
SPLIT_REFUSED = "SPLIT_REFUSED"  # each shard describes; the set is BAD_MODEL naming the shard (S1)
UNSAFE_FORMAT = "UNSAFE_FORMAT"  # describe lists pickle files; load is UNSAFE_FORMAT (P1)


@dataclasses.dataclass(frozen=True)
class Link:
    """A link to write: ``hard`` or symbolic, to ``target`` (relative to the corpus root, or absolute)."""

    target: str
    hard: bool = False


@dataclasses.dataclass(frozen=True)
class Fault:
    """One input of the corpus: files to write, which path to describe, and the stated outcome."""

    row: str
    name: str
    seed: int
    files: dict[str, bytes | Link]
    target: str
    expect: str
    #: Words the error message must hold (BAD_MODEL names the fault).
    words: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        """A test id: ``G3-n_tensors 2^63-s1``."""
        return f"{self.row}-{self.name}-s{self.seed}"

    def write(self, root: Path) -> Path:
        """Write the files under ``root`` and return the path to describe."""
        for name, content in self.files.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Link):
                target = Path(content.target) if content.target.startswith("/") else root / content.target
                if content.hard:
                    path.hardlink_to(target)
                else:
                    path.symlink_to(target)
            else:
                path.write_bytes(content)
        return root / self.target


# ---- honest GGUF parts a seed varies -----------------------------------------------------------------


def _kvs(rng: random.Random) -> list[bytes]:
    entries = [kv("general.architecture", STRING, "llama"), kv("general.name", STRING, f"corpus-{rng.randrange(1000)}")]
    entries.append(kv("llama.block_count", U32, rng.randrange(1, 9)))
    for index in range(rng.randrange(0, 4)):
        entries.append(kv(f"corpus.key{index}", U32, rng.randrange(2**32)))
    if rng.random() < 0.5:
        entries.append(kv_array("tokenizer.ggml.tokens", STRING, [f"t{i}" for i in range(rng.randrange(1, 9))]))
    return entries


def _tensors(rng: random.Random, count: int | None = None) -> list[Tensor]:
    tensors = []
    for index in range(rng.randrange(1, 5) if count is None else count):
        ggml_type = rng.choice([GGML_F32, GGML_F16, GGML_Q8_0])
        first = 32 * rng.randrange(1, 4) if ggml_type == GGML_Q8_0 else rng.randrange(1, 17)
        dims = (first, *(rng.randrange(1, 5) for _ in range(rng.randrange(0, 3))))
        tensors.append(Tensor(f"blk.{index}.w{rng.randrange(100)}", dims, ggml_type))
    return tensors


def _gguf(rng: random.Random, **overrides: object) -> bytes:
    args: dict[str, object] = {"tensors": _tensors(rng), "kvs": _kvs(rng)}
    args.update(overrides)
    return make_gguf(**args)  # type: ignore[arg-type]


def _one(name: str, data: bytes) -> dict[str, bytes | Link]:
    return {name: data}


# ---- the rows ------------------------------------------------------------------------------------------

# Each builder takes the seed's random generator and returns (name, files, target, words) cases.
Case = tuple[str, dict[str, bytes | Link], str, tuple[str, ...]]


def _g1(rng: random.Random) -> Iterator[Case]:
    yield "empty file", _one("m.gguf", b""), "m.gguf", ()
    yield (
        "wrong magic",
        _one("m.gguf", rng.choice([b"GGML", b"GGJT", b"\x00\x00\x00\x00"]) + _gguf(rng)[4:]),
        "m.gguf",
        ("magic",),
    )
    version = rng.choice([0, 1, 99])
    yield f"version {version}", _one("m.gguf", _gguf(rng, version=version)), "m.gguf", ("version",)


def _g2(rng: random.Random) -> Iterator[Case]:
    data = _gguf(rng)
    yield "header cut short", _one("m.gguf", data[: rng.randrange(4, 40)]), "m.gguf", ()
    yield "cut at 50%", _one("m.gguf", data[: len(data) // 2]), "m.gguf", ()
    yield "one byte short", _one("m.gguf", data[:-1]), "m.gguf", ()


def _g3(rng: random.Random) -> Iterator[Case]:
    yield "n_tensors 2^63", _one("m.gguf", _gguf(rng, n_tensors=2**63)), "m.gguf", ()
    yield "n_kv 2^64-1", _one("m.gguf", _gguf(rng, n_kv=2**64 - 1)), "m.gguf", ()


def _g4(rng: random.Random) -> Iterator[Case]:
    key = gguf_str("general.name", length=2**63) + u32(STRING) + gguf_str("x")
    yield "key length 2^63", _one("m.gguf", _gguf(rng, kvs=[*_kvs(rng), key])), "m.gguf", ()
    value = kv_raw("corpus.s", STRING, u64(2**62) + b"ab")
    yield "string 2^62 with 2 bytes", _one("m.gguf", _gguf(rng, kvs=[*_kvs(rng), value])), "m.gguf", ()


def _g5(rng: random.Random) -> Iterator[Case]:
    huge = kv_raw("corpus.a", ARRAY, u32(U8) + u64(2**62) + bytes(rng.randrange(0, 16)))
    yield "2^62 u8 in a few bytes", _one("m.gguf", make_gguf([], [huge])), "m.gguf", ()
    empties = kv_raw("corpus.a", ARRAY, array_payload(STRING, [], count=2**40))
    yield "2^40 empty strings", _one("m.gguf", _gguf(rng, kvs=[*_kvs(rng), empties])), "m.gguf", ()


def _g6(rng: random.Random) -> Iterator[Case]:
    deep = kv_raw("corpus.nested", ARRAY, nested_arrays(5000 + rng.randrange(100)))
    yield "arrays nested 5000 deep", _one("m.gguf", _gguf(rng, kvs=[*_kvs(rng), deep])), "m.gguf", ()


def _g7(rng: random.Random) -> Iterator[Case]:
    vtype = rng.choice([13, 99, 2**32 - 1])
    yield (
        f"value type {vtype}",
        _one("m.gguf", _gguf(rng, kvs=[*_kvs(rng), kv_raw("corpus.x", vtype, b"\x00" * 8)])),
        ("m.gguf"),
        (),
    )
    ggml_type = rng.choice([9999, -1, -(2**31)])
    tensors = [*_tensors(rng), Tensor("bad.type", (8,), ggml_type)]
    yield f"ggml type {ggml_type}", _one("m.gguf", _gguf(rng, tensors=tensors)), "m.gguf", ()


def _g8(rng: random.Random) -> Iterator[Case]:
    kvs = _kvs(rng)
    yield "duplicate key", _one("m.gguf", _gguf(rng, kvs=[*kvs, rng.choice(kvs)])), "m.gguf", ("duplicate",)
    tensors = _tensors(rng)
    twin = dataclasses.replace(rng.choice(tensors))
    yield "duplicate tensor name", _one("m.gguf", _gguf(rng, tensors=[*tensors, twin])), "m.gguf", ("duplicate",)
    yield "empty key", _one("m.gguf", _gguf(rng, kvs=[*_kvs(rng), kv("", U32, 1)])), "m.gguf", ()


def _g9(rng: random.Random) -> Iterator[Case]:
    value = rng.choice([0, 3, 2**31])
    yield (
        f"alignment {value}",
        _one("m.gguf", _gguf(rng, kvs=[*_kvs(rng), kv("general.alignment", U32, value)])),
        ("m.gguf"),
        ("alignment",),
    )
    vtype, value = rng.choice([(STRING, "32"), (F32, 32.0), (U64, 32)])
    wrong = kv("general.alignment", vtype, value)
    yield "alignment of the wrong type", _one("m.gguf", _gguf(rng, kvs=[*_kvs(rng), wrong])), "m.gguf", ("alignment",)


def _g10(rng: random.Random) -> Iterator[Case]:
    tensors = [*_tensors(rng), Tensor("too.many.dims", (8,), GGML_F32, n_dims=255)]
    yield "n_dims 255", _one("m.gguf", _gguf(rng, tensors=tensors)), "m.gguf", ()


def _g11(rng: random.Random) -> Iterator[Case]:
    tensors = [*_tensors(rng), Tensor("huge", (2**32, 2**32, 2**32), GGML_F32, offset=0)]
    yield (
        "dims 2^32 cubed",
        _one("m.gguf", _gguf(rng, tensors=tensors, data_bytes=rng.randrange(64, 1024))),
        "m.gguf",
        (),
    )
    tensors = [*_tensors(rng), Tensor("over", (2**63, 4), GGML_F32, offset=0)]
    yield (
        "bytes over 2^64",
        _one("m.gguf", _gguf(rng, tensors=tensors, data_bytes=rng.randrange(64, 1024))),
        "m.gguf",
        (),
    )


def _g12(rng: random.Random) -> Iterator[Case]:
    for name, offset in (("past the end", 2**20 + 32 * rng.randrange(100)), ("2^64-1", 2**64 - 1), ("unaligned", 1)):
        tensors = _tensors(rng)
        tensors[-1] = dataclasses.replace(tensors[-1], offset=offset)
        if len(tensors) == 1 and name == "unaligned":
            tensors.insert(0, Tensor("first", (8,), GGML_F32))
        data = _gguf(rng, tensors=tensors, data_bytes=4096)
        yield f"tensor offset {name}", _one("m.gguf", data), "m.gguf", ()


def _g13(rng: random.Random) -> Iterator[Case]:
    tensors = [Tensor("a", (8,), GGML_F32, offset=0), Tensor("b", (8,), GGML_F32, offset=0)]
    yield "two tensors at one offset", _one("m.gguf", _gguf(rng, tensors=tensors)), "m.gguf", ()
    gap = 32 * rng.randrange(2, 6)
    tensors = [Tensor("a", (8,), GGML_F32, offset=0), Tensor("b", (8,), GGML_F32, offset=gap)]
    yield "a gap between tensors", _one("m.gguf", _gguf(rng, tensors=tensors, data_bytes=gap + 32)), "m.gguf", ()


def _g14(rng: random.Random) -> Iterator[Case]:
    tensors = [*_tensors(rng), Tensor("empty", (rng.randrange(1, 9), 0), GGML_F32)]
    yield "a zero dimension", _one("m.gguf", _gguf(rng, tensors=tensors)), "m.gguf", ()


def _g15(rng: random.Random) -> Iterator[Case]:
    name = rng.choice([b"\xff\xfe", b"blk.\xc3", b"\xed\xa0\x80"])
    tensors = [*_tensors(rng), Tensor(name, (8,), GGML_F32)]
    yield "tensor name not UTF-8", _one("m.gguf", _gguf(rng, tensors=tensors)), "m.gguf", ()


#: Chat templates that reach for Python internals (CVE-2024-34359's shape).
MRO_TEMPLATES = (
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{% for c in ().__class__.__base__.__subclasses__() %}{{ c.__name__ }}{% endfor %}",
    "{{ messages.__class__.__mro__ }}",
    "{{ self.__init__.__globals__ }}",
)


def _g16(rng: random.Random) -> Iterator[Case]:
    template = rng.choice(MRO_TEMPLATES)
    kvs = [*_kvs(rng), kv("tokenizer.chat_template", STRING, template)]
    yield "chat template reaching __mro__", _one("m.gguf", _gguf(rng, kvs=kvs)), "m.gguf", ()


def _g17(rng: random.Random) -> Iterator[Case]:
    kvs = [e for e in _kvs(rng) if b"llama.block_count" not in e]
    kvs.append(kv("llama.block_count", U32, rng.choice([10_000, 2**31, 2**32 - 1])))
    yield "block_count absurd", _one("m.gguf", _gguf(rng, kvs=kvs)), "m.gguf", ()


def _s1(rng: random.Random) -> Iterator[Case]:
    count = rng.randrange(2, 5)
    names = [f"m-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    shards = [split_shard(i, count, [f"t{i}.{j}" for j in range(2)], 2 * count) for i in range(1, count + 1)]
    missing = rng.randrange(count)
    files = {n: s for i, (n, s) in enumerate(zip(names, shards, strict=True)) if i != missing}
    yield "a shard missing", files, "", (f"{missing + 1:05d}",)
    swapped = dict(zip(names, shards, strict=True))
    swapped[names[0]], swapped[names[1]] = shards[1], shards[0]
    yield "shards swapped", swapped, "", (names[0],)
    wrong = dict(zip(names, shards, strict=True))
    wrong[names[-1]] = split_shard(count, count, [f"t{count}.0", f"t{count}.1"], 2 * count, split_count=count + 1)
    yield "counts disagree", wrong, "", (names[-1],)


def _o1(rng: random.Random) -> Iterator[Case]:
    def model(location: str) -> bytes:
        return onnx_model(onnx_graph([onnx_tensor("w", location=location, offset=0, length=16)]))

    secret = {"outside/secret.bin": bytes(range(16)) * rng.randrange(1, 3)}
    yield "data at ../x", {**secret, "model/model.onnx": model("../outside/secret.bin")}, "model/model.onnx", ()
    yield "data at /etc/passwd", {"model/model.onnx": model("/etc/passwd")}, "model/model.onnx", ()
    yield (
        "symlink out of the folder",
        {
            **secret,
            "model/model.onnx": model("w.bin"),
            "model/w.bin": Link("outside/secret.bin"),
        },
        "model/model.onnx",
        (),
    )
    yield (
        "hardlink out of the folder",
        {
            **secret,
            "model/model.onnx": model("w.bin"),
            "model/w.bin": Link("outside/secret.bin", hard=True),
        },
        "model/model.onnx",
        ("hardlink",),
    )


def _o1_legitimate(rng: random.Random) -> Iterator[Case]:
    snapshot = f"hub/models--org--m{rng.randrange(100)}/snapshots/{rng.randrange(16**8):08x}"
    blobs = snapshot.split("/snapshots/")[0] + "/blobs"
    yield (
        "hub-cache snapshot links into blobs",
        {
            f"{blobs}/aaaa": onnx_model(onnx_graph([onnx_tensor("w", location="model.onnx_data")])),
            f"{blobs}/bbbb": bytes(16),
            f"{snapshot}/model.onnx": Link(f"{blobs}/aaaa"),
            f"{snapshot}/model.onnx_data": Link(f"{blobs}/bbbb"),
        },
        f"{snapshot}/model.onnx",
        (),
    )


def _t1(rng: random.Random) -> Iterator[Case]:
    header = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
    yield (
        "header 2^63 long",
        _one("m.safetensors", make_safetensors(header, bytes(16), header_len=2**63)),
        ("m.safetensors"),
        (),
    )
    overlap = {**header, "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}
    yield "overlapping tensors", _one("m.safetensors", make_safetensors(overlap, bytes(16))), "m.safetensors", ()
    trailing = make_safetensors(header, bytes(16 + rng.randrange(1, 64)))
    yield "trailing data", _one("m.safetensors", trailing), "m.safetensors", ()
    entry = json.dumps(header["w"])
    raw = f'{{"w": {entry}, "w": {entry}}}'
    yield (
        "duplicate JSON keys",
        _one("m.safetensors", make_safetensors(raw, bytes(16))),
        "m.safetensors",
        ("duplicate",),
    )


def pickle_payload(marker: Path | str) -> bytes:
    """A pickle (protocol 0, written by hand) that runs ``touch marker`` if anything ever unpickles it."""
    return f"cos\nsystem\n(S'touch {marker}'\ntR.".encode()


def _p1(rng: random.Random) -> Iterator[Case]:
    name = rng.choice(["pytorch_model.bin", "model.pt", "weights.pth", "last.ckpt"])
    config = json.dumps({"model_type": "llama"}).encode()
    files: dict[str, bytes | Link] = {"model/config.json": config, f"model/{name}": pickle_payload("PICKLE_RAN")}
    yield f"only pickle weights ({name})", files, "model", ()
    yield f"a lone {name}", {name: pickle_payload("PICKLE_RAN")}, name, ()


#: Every row: (row id, case builder, expected outcome).
ROWS: tuple[tuple[str, Callable[[random.Random], Iterator[Case]], str], ...] = (
    ("G1", _g1, BAD_MODEL),
    ("G2", _g2, BAD_MODEL),
    ("G3", _g3, BAD_MODEL),
    ("G4", _g4, BAD_MODEL),
    ("G5", _g5, BAD_MODEL),
    ("G6", _g6, BAD_MODEL),
    ("G7", _g7, BAD_MODEL),
    ("G8", _g8, BAD_MODEL),
    ("G9", _g9, BAD_MODEL),
    ("G10", _g10, BAD_MODEL),
    ("G11", _g11, BAD_MODEL),
    ("G12", _g12, BAD_MODEL),
    ("G13", _g13, BAD_MODEL),
    ("G14", _g14, ACCEPTED_OR_BAD_MODEL),
    ("G15", _g15, BAD_MODEL),
    ("G16", _g16, TEMPLATE_REFUSED),
    ("G17", _g17, ACCEPTED),  # the core's header reader has no architecture limits; the back end refuses it
    ("S1", _s1, SPLIT_REFUSED),
    ("O1", _o1, BAD_MODEL),
    ("O1", _o1_legitimate, ACCEPTED),
    ("T1", _t1, BAD_MODEL),
    ("P1", _p1, UNSAFE_FORMAT),
)


def corpus(seeds: int = 3) -> list[Fault]:
    """Every case of every row, for seeds ``0 .. seeds-1``, each input once.

    A case the seed does not change (an empty file, a lone ``last.ckpt``) would come back
    byte-identical under every seed and test nothing new: only its first seed is kept.
    """
    faults = []
    seen: set[tuple[str, str, tuple[tuple[str, bytes | Link], ...], str]] = set()
    for row, build, expect in ROWS:
        for seed in range(seeds):
            rng = random.Random(f"{row}-{build.__name__}-{seed}")
            for name, files, target, words in build(rng):
                key = (row, name, tuple(sorted(files.items(), key=lambda item: item[0])), target)
                if key in seen:
                    continue
                seen.add(key)
                faults.append(Fault(row, name, seed, files, target, expect, words))
    return faults
