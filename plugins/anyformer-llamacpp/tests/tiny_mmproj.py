"""Writes a tiny random LLaVA-style multimodal projector (``mmproj``) GGUF that llama.cpp's clip loader accepts.

The projector type is ``mlp`` (LLaVA 1.5's): a small CLIP ViT (patch embedding, class embedding,
position embeddings, pre-norm transformer blocks) whose patch features pass through two linear
layers with a GELU between them into the language model's embedding width. Key and tensor names
are the ones llama.cpp's ``tools/mtmd`` loader reads (``clip.vision.*`` keys, ``v.*`` and ``mm.*``
tensors).
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np


def write_tiny_mmproj(
    path: Path,
    *,
    seed: int = 0,
    text_embedding: int = 64,
    image_size: int = 32,
    patch_size: int = 8,
    width: int = 32,
    heads: int = 4,
    layers: int = 2,
    projector_type: str = "mlp",
    vision: bool = True,
    drop_tensors: tuple[str, ...] = (),
) -> Path:
    """Write a random projector whose output width is ``text_embedding``; returns ``path``.

    ``drop_tensors`` leaves those tensors out; with ``vision=False`` the header says it has no
    vision encoder.
    """
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_name("tiny-mmproj")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_clip_projector_type(projector_type)
    writer.add_clip_has_vision_encoder(vision)
    writer.add_vision_image_size(image_size)
    writer.add_vision_patch_size(patch_size)
    writer.add_vision_embedding_length(width)
    writer.add_vision_feed_forward_length(width * 2)
    writer.add_vision_projection_dim(text_embedding)
    writer.add_vision_block_count(layers)
    writer.add_vision_head_count(heads)
    writer.add_vision_attention_layernorm_eps(1e-5)
    writer.add_vision_image_mean([0.5, 0.5, 0.5])
    writer.add_vision_image_std([0.5, 0.5, 0.5])
    writer.add_vision_use_gelu(True)

    def tensor(name: str, *shape: int, scale: float = 0.2, value: float | None = None) -> None:
        if name in drop_tensors:
            return
        if value is not None:
            data = np.full(shape, value, dtype=np.float32)
        else:
            data = (rng.standard_normal(shape) * scale).astype(np.float32)
        writer.add_tensor(name, data)

    patches = (image_size // patch_size) ** 2
    # numpy shapes are ggml's dimensions reversed: a linear layer is (out, in).
    tensor("v.patch_embd.weight", width, 3, patch_size, patch_size)
    tensor("v.class_embd", width)
    tensor("v.position_embd.weight", patches + 1, width)
    tensor("v.pre_ln.weight", width, value=1.0)
    tensor("v.pre_ln.bias", width, value=0.0)
    for i in range(layers):
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensor(f"v.blk.{i}.{part}.weight", width, width)
            tensor(f"v.blk.{i}.{part}.bias", width)
        for norm in ("ln1", "ln2"):
            tensor(f"v.blk.{i}.{norm}.weight", width, value=1.0)
            tensor(f"v.blk.{i}.{norm}.bias", width, value=0.0)
        tensor(f"v.blk.{i}.ffn_up.weight", width * 2, width)
        tensor(f"v.blk.{i}.ffn_up.bias", width * 2)
        tensor(f"v.blk.{i}.ffn_down.weight", width, width * 2)
        tensor(f"v.blk.{i}.ffn_down.bias", width)
    tensor("mm.0.weight", text_embedding, width)
    tensor("mm.0.bias", text_embedding)
    tensor("mm.2.weight", text_embedding, text_embedding)
    tensor("mm.2.bias", text_embedding)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def png_bytes(pixels: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of an HxWx3 uint8 array, written with zlib and struct."""
    height, width = pixels.shape[:2]

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))  # filter 0 on every row
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def random_pixels(height: int, width: int, seed: int = 0) -> np.ndarray:
    """An HxWx3 uint8 array of random pixels."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
