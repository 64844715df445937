"""Random test data: ggml blocks with finite scales, and random GGUF models that llama.cpp also reads.

For tests and benches (gguf-py is needed for the GGUF writer; it is a test dependency, imported here
only inside the functions that write files).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from anyformer_gguf_gpu.quants import BF16, F16, F32, FORMATS, QuantFormat

# Byte offsets of each block format's f16 scale fields (ggml-common.h).
_F16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(fmt: QuantFormat, n_elements: int, rng: np.random.Generator, scale: float = 0.05) -> np.ndarray:
    """Random raw bytes of ``n_elements`` in ``fmt``: random quants, f16 scales drawn in ±``scale``."""
    if fmt in (F32, F16, BF16):
        values = rng.standard_normal(n_elements).astype(np.float32)
        if fmt is F32:
            return values.view(np.uint8).copy()
        if fmt is F16:
            return values.astype("<f2").view(np.uint8).copy()
        return (values.view(np.uint32) >> 16).astype("<u2").view(np.uint8).copy()
    if n_elements % fmt.block_size:
        raise ValueError(f"{n_elements} is not a multiple of {fmt.name}'s block of {fmt.block_size}")
    blocks = rng.integers(0, 256, size=(n_elements // fmt.block_size, fmt.type_size), dtype=np.uint8)
    for offset in _F16_FIELDS[fmt.name]:
        scales = np.asarray(rng.uniform(-scale, scale, size=blocks.shape[0])).astype("<f2")
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)


def byte_level_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order (how byte-level BPE vocabularies spell bytes)."""
    keep = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = {}
    extra = 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


#: The merges of the tiny test vocabulary (each also becomes a token).
TINY_MERGES = ("Ġ t", "h e", "Ġ a", "i n", "Ġt he", "e r", "o n", "Ġ s", "e s", "r e")

#: The chat template of the test models (ChatML, as Qwen's).
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_vocabulary(n_vocab: int | None = None) -> list[str]:
    """The test tokens: three specials, the 256 byte-level tokens, the merges, then fillers up to ``n_vocab``."""
    tokens = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        *byte_level_alphabet(),
        *(m.replace(" ", "") for m in TINY_MERGES),
    ]
    if n_vocab is not None and n_vocab > len(tokens):
        tokens += [f"<filler{i}>" for i in range(n_vocab - len(tokens))]
    return tokens


def add_attention_keys(w: Any, n_head: int, n_kv: int, head_dim: int, rope_base: float, eps: float) -> None:
    """Write the header's head counts, head widths, rotary width and base, and the RMSNorm epsilon."""
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(eps)


def add_tiny_tokenizer(w: Any, tokens: list[str], pre: str) -> None:
    """Write the byte-level BPE tokenizer of ``tokens`` (from :func:`tiny_vocabulary`) and the chat template."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_token_merges(list(TINY_MERGES))
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(TINY_CHAT_TEMPLATE)


def add_layer_attention(
    prefix: str,
    n_embd: int,
    q_dim: int,
    kv_dim: int,
    matrix: Callable[[str, int, int], None],
    vector: Callable[[str, int], None],
    after_qkv: Callable[[], None],
) -> None:
    """Write one layer's attention norm, q/k/v, ``after_qkv`` (the architecture's q/k norms or biases),
    the output projection and the feed-forward norm, in that order (rows first, as gguf-py takes them)."""
    vector(prefix + "attn_norm.weight", n_embd)
    matrix(prefix + "attn_q.weight", q_dim, n_embd)
    matrix(prefix + "attn_k.weight", kv_dim, n_embd)
    matrix(prefix + "attn_v.weight", kv_dim, n_embd)
    after_qkv()
    matrix(prefix + "attn_output.weight", n_embd, q_dim)
    vector(prefix + "ffn_norm.weight", n_embd)


def finish_gguf(w: Any) -> None:
    """Write the header, the key-values and the tensors, and close the file."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@dataclasses.dataclass(frozen=True)
class RandomModel:
    """The shape of a random test model (a GGUF llama.cpp and the engines both read)."""

    architecture: str = "llama"
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_kv: int = 2
    head_dim: int = 16
    n_ff: int = 96
    n_ctx: int = 256
    tied: bool = True
    quant: str = "Q8_0"
    rope_base: float = 10000.0
    scale: float = 0.02
    #: Vocabulary size; the byte-level tokens and a few merges come first, then filler tokens.
    n_vocab: int | None = None


def _quant_tensor(values: np.ndarray, quant: str, rng: np.random.Generator) -> tuple[np.ndarray, Any]:
    """(data, raw_dtype) for GGUFWriter.add_tensor: gguf-py quantises what it can; K types get random blocks."""
    import gguf

    qtype = gguf.GGMLQuantizationType[quant]
    if quant in ("F32",):
        return values.astype(np.float32), None
    if quant in ("F16", "BF16", "Q4_0", "Q4_1", "Q8_0"):
        return gguf.quants.quantize(values.astype(np.float32), qtype), qtype
    fmt = next(f for f in FORMATS.values() if f.name == quant)
    rows, cols = values.shape
    # K-quant blocks are random: their 6-bit sub-scales multiply d, so keep d small.
    raw = random_blocks(fmt, rows * cols, rng, scale=0.0005)
    return raw.reshape(rows, cols // fmt.block_size * fmt.type_size), qtype


def write_random_gguf(path: str, spec: RandomModel, seed: int = 0) -> None:
    """Write a random model of ``spec``'s shape, with a small byte-level BPE vocabulary, as a GGUF."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens = tiny_vocabulary(spec.n_vocab)
    n_vocab = len(tokens)
    arch = spec.architecture
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(spec.n_layer)
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff)
    add_attention_keys(w, spec.n_head, spec.n_kv, spec.head_dim, spec.rope_base, 1e-5)
    add_tiny_tokenizer(w, tokens, "gpt-2")

    def matrix(name: str, rows: int, cols: int, quant: str | None = None) -> None:
        values = rng.standard_normal((rows, cols)).astype(np.float32) * spec.scale * 8
        data, raw_dtype = _quant_tensor(values, quant or spec.quant, rng)
        w.add_tensor(name, data, raw_dtype=raw_dtype)

    def vector(name: str, n: int) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    q_dim, kv_dim = spec.n_head * spec.head_dim, spec.n_kv * spec.head_dim
    matrix("token_embd.weight", n_vocab, spec.n_embd)
    for i in range(spec.n_layer):
        p = f"blk.{i}."

        def qk_norms(p: str = p) -> None:
            if arch == "qwen3":
                vector(p + "attn_q_norm.weight", spec.head_dim)
                vector(p + "attn_k_norm.weight", spec.head_dim)

        add_layer_attention(p, spec.n_embd, q_dim, kv_dim, matrix, vector, qk_norms)
        matrix(p + "ffn_gate.weight", spec.n_ff, spec.n_embd)
        matrix(p + "ffn_up.weight", spec.n_ff, spec.n_embd)
        matrix(p + "ffn_down.weight", spec.n_embd, spec.n_ff)
    vector("output_norm.weight", spec.n_embd)
    if not spec.tied:
        matrix("output.weight", n_vocab, spec.n_embd)
    finish_gguf(w)


#: The wgpu device methods that compile WGSL (a shader module) or build a compute pipeline from one.
COMPILERS = ("create_shader_module", "create_compute_pipeline", "create_compute_pipeline_async")
#: The wgpu device methods that make what a step binds: bind groups and buffers (uniform blocks among them).
BINDERS = ("create_bind_group", "create_buffer")


@contextlib.contextmanager
def compiles_counted(device: Any, methods: Sequence[str] = COMPILERS) -> Iterator[list[str]]:
    """Inside the block, record each call of ``methods`` (:data:`COMPILERS` by default; add :data:`BINDERS`
    for bind groups and buffers) on ``device``'s class as ``method(label)``.

    The class is patched (and restored after), so a device reached through any reference is counted:
    the check that an engine compiles and binds everything at load and nothing on its first tokens.
    """
    made: list[str] = []
    cls = type(device)
    originals = {name: getattr(cls, name) for name in methods if hasattr(cls, name)}
    own = {name: cls.__dict__[name] for name in originals if name in cls.__dict__}  # the others are inherited

    def counting(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            made.append(f"{name}({kwargs.get('label', '')})")
            return original(self, *args, **kwargs)

        return counted

    try:
        for name, original in originals.items():
            setattr(cls, name, counting(name, original))
        yield made
    finally:
        for name in originals:
            if name in own:
                setattr(cls, name, own[name])
            else:
                delattr(cls, name)
