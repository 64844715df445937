"""The llama.cpp boundary for multimodal projectors (``mmproj``): numbers and tensor shapes checked first.

llama.cpp's clip loader checks little: a LLaVA projector without its ``mm.0.weight`` segfaults
while it warms up, and a head count that does not divide the width, or a patch larger than the
image, aborts the process in a ggml assertion (probed on llama-cpp-python 0.3.36). So every
projector's vision numbers are bounded here, and the LLaVA family (``mlp``, ``mlp_norm``), whose
graph is known, has every tensor its graph reads checked for presence, shape and type, all as
``BAD_MODEL`` before llama.cpp opens the file. Other projector types get the number checks only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from anyformer.plugin import AnyformerError, ErrorCode, GGUFHeader

#: Projector types whose tensors are checked one by one (LLaVA 1.5 and its kin).
LLAVA_TYPES = ("mlp", "mlp_norm")

# Upper bounds far above any released vision tower (SigLIP-so400m: width 1152, 27 blocks).
_LIMITS = {
    "image_size": 1 << 14,
    "patch_size": 1 << 10,
    "embedding_length": 1 << 16,
    "feed_forward_length": 1 << 20,
    "projection_dim": 1 << 18,
    "block_count": 1024,
    "attention.head_count": 4096,
}
#: Most patches one image may make ((image_size / patch_size)^2); real towers make a few thousand.
MAX_PATCHES = 1 << 18

_F32, _F16 = 0, 1


@dataclasses.dataclass(frozen=True)
class ProjectorFacts:
    """What the checks learnt: the projector type and whether it has a vision encoder."""

    projector_type: str
    vision: bool


def _bad(name: str, why: str) -> AnyformerError:
    return AnyformerError(ErrorCode.BAD_MODEL, f"{name}: {why}")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_projector(name: str, header: GGUFHeader, text_embedding: int | None) -> ProjectorFacts:
    """Raise ``BAD_MODEL`` for a projector llama.cpp could crash on; return its type and modalities."""
    if header.architecture != "clip":
        raise _bad(name, f"not a multimodal projector (general.architecture is {header.architecture!r}, not 'clip')")
    kind = header.get("clip.vision.projector_type", header.get("clip.projector_type"))
    if not isinstance(kind, str) or not kind:
        raise _bad(name, "the projector names no clip.projector_type")
    if header.get("clip.has_vision_encoder") is not True:
        return ProjectorFacts(projector_type=kind, vision=False)
    numbers: dict[str, int] = {}
    for key, limit in _LIMITS.items():
        value = header.get(f"clip.vision.{key}")
        if value is None:
            continue
        if not _int(value) or not 0 <= value <= limit:
            raise _bad(name, f"clip.vision.{key} = {value!r} is beyond any real vision tower (limit {limit})")
        numbers[key] = value
    width = numbers.get("embedding_length", 0)
    patch = numbers.get("patch_size", 0)
    image = numbers.get("image_size", 0)
    if width < 1 or patch < 1:
        raise _bad(name, "clip.vision.embedding_length and clip.vision.patch_size must be at least 1")
    if image and patch > image:
        raise _bad(name, f"clip.vision.patch_size {patch} is larger than clip.vision.image_size {image}")
    if image and (image // patch) ** 2 > MAX_PATCHES:
        raise _bad(name, f"an image of {image} px in {patch} px patches is {(image // patch) ** 2} patches")
    heads = numbers.get("attention.head_count", 0)
    if numbers.get("block_count", 0) and header.get("clip.vision.attention.head_dim") is None:
        if heads < 1 or width % heads:
            raise _bad(name, f"clip.vision.attention.head_count {heads} does not divide the width {width}")
    if kind in LLAVA_TYPES:
        _check_llava_tensors(name, header, kind, numbers, text_embedding)
    return ProjectorFacts(projector_type=kind, vision=True)


def _check_llava_tensors(
    name: str, header: GGUFHeader, kind: str, numbers: dict[str, int], text_embedding: int | None
) -> None:
    """Every tensor LLaVA's graph reads: present where it must be, of the shape the numbers imply."""
    tensors = {t.name: t for t in header.tensors}
    width, patch, image = numbers["embedding_length"], numbers["patch_size"], numbers.get("image_size", 0)
    if image < 1:
        raise _bad(name, f"a {kind} projector needs clip.vision.image_size")

    def dims(tensor: str, *, required: bool = True) -> tuple[int, ...] | None:
        found = tensors.get(tensor)
        if found is None:
            if required:
                raise _bad(name, f"the {kind} projector has no tensor {tensor}")
            return None
        if len(found.dims) == 1 and found.ggml_type not in (_F32, _F16):
            raise _bad(name, f"{tensor} is {found.type_name}; a vector must be F32 or F16")
        return found.dims

    def expect(tensor: str, shape: tuple[int, ...], *, required: bool = True) -> bool:
        got = dims(tensor, required=required)
        if got is not None and got != shape:
            raise _bad(name, f"{tensor} has shape {list(got)}, expected {list(shape)}")
        return got is not None

    expect("v.patch_embd.weight", (patch, patch, 3, width))
    has_class = expect("v.class_embd", (width,), required=False)
    positions = dims("v.position_embd.weight")
    needed = (image // patch) ** 2 + (1 if has_class else 0)
    if positions is None or len(positions) != 2 or positions[0] != width or positions[1] < needed:
        raise _bad(name, f"v.position_embd.weight has shape {list(positions or ())}, expected [{width}, {needed}]")
    for norm in ("v.pre_ln", "v.post_ln"):
        expect(f"{norm}.weight", (width,), required=False)
        expect(f"{norm}.bias", (width,), required=False)
    for il in range(numbers.get("block_count", 0)):
        block = f"v.blk.{il}"
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            expect(f"{block}.{part}.weight", (width, width))
            expect(f"{block}.{part}.bias", (width,), required=False)
        for norm in ("ln1", "ln2"):
            expect(f"{block}.{norm}.weight", (width,))
            expect(f"{block}.{norm}.bias", (width,), required=False)
        up, down = dims(f"{block}.ffn_up.weight"), dims(f"{block}.ffn_down.weight")
        assert up is not None and down is not None
        # [width, ff] then [ff, width]; old conversions swapped the names, which llama.cpp undoes.
        if not (len(up) == 2 and len(down) == 2 and up == (down[1], down[0]) and width in (up[0], down[0])):
            raise _bad(name, f"{block}.ffn_up/ffn_down have shapes {list(up)} and {list(down)}; not a {width}-wide MLP")
        for bias, size in ((f"{block}.ffn_up.bias", up[1]), (f"{block}.ffn_down.bias", down[1])):
            expect(bias, (size,), required=False)
        gate = dims(f"{block}.ffn_gate.weight", required=False)
        if gate is not None and gate not in (up, down):
            raise _bad(name, f"{block}.ffn_gate.weight has shape {list(gate)}, unlike ffn_up {list(up)}")
    layers = header.get("clip.vision.feature_layer")
    stacked = width * (len(layers) if isinstance(layers, list) and layers else 1)
    out = _linear(name, dims, "mm.0", stacked)
    if kind == "mlp":
        if "mm.2.weight" in tensors:
            out = _linear(name, dims, "mm.2", out)
    else:
        expect("mm.1.weight", (out,))
        expect("mm.1.bias", (out,))
        out = _linear(name, dims, "mm.3", out)
        expect("mm.4.weight", (out,))
        expect("mm.4.bias", (out,))
    if text_embedding is not None and out != text_embedding:
        raise _bad(name, f"the projector makes {out}-wide embeddings; the language model's width is {text_embedding}")


def _linear(name: str, dims: Any, prefix: str, width_in: int) -> int:
    weight = dims(f"{prefix}.weight")
    if len(weight) != 2 or weight[0] != width_in:
        raise _bad(name, f"{prefix}.weight has shape {list(weight)}, expected [{width_in}, n]")
    bias = dims(f"{prefix}.bias")
    if bias != (weight[1],):
        raise _bad(name, f"{prefix}.bias has shape {list(bias)}, expected [{weight[1]}]")
    return int(weight[1])
