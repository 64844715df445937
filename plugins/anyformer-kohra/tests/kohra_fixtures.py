"""Tiny text-diffusion repos for the tests: a byte-level tokenizer, a random DiT exported to ONNX, a model card.

Each repo is built once and cached under ``~/.cache/anyformer-test-fixtures/`` in a folder named by a
hash of the recipe (this file, tiny_diffusion.py) and the torch/onnx versions, so a change to either
rebuilds it. A build goes to a temporary folder renamed into place, so concurrent test runs never see
half a repo.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import tiny_diffusion

#: Byte-level tokens 0-255, then these specials: the vocabulary is 260.
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "[MASK]")
VOCAB = 256 + len(SPECIALS)
MASK_ID = 259
IM_END_ID = 258
BLOCK_SIZE = 4
MODEL_LENGTH = 512
#: The byte-level ids of printable ASCII: the alphabet is sorted by code point, so ``!``..``~`` are 0..93
#: and the space (byte 32, shown as U+0120) comes after the other remapped control bytes.
READABLE = (*range(94), 188 + 32)
KINDS = {
    "mdlm": tiny_diffusion.TinyConfig(VOCAB, seed=1, readable=READABLE),
    "mdlm-tc": tiny_diffusion.TinyConfig(VOCAB, time_conditioning=True, seed=2, readable=READABLE),
    "bd3lm": tiny_diffusion.TinyConfig(VOCAB, kv_cache=True, seed=3, readable=READABLE),
    # The same weights as bd3lm (same seed), exported without a cache: block-causal attention comes from
    # a 4-D attention_mask, so kohra recomputes the sequence for every block.
    "bd3lm-mask": tiny_diffusion.TinyConfig(VOCAB, mask_input=True, seed=3, readable=READABLE),
    # The same weights again, with both the cache and the mask: one graph that runs either way.
    "bd3lm-both": tiny_diffusion.TinyConfig(VOCAB, kv_cache=True, mask_input=True, seed=3, readable=READABLE),
}
BLOCK_KINDS = ("bd3lm", "bd3lm-mask", "bd3lm-both")
#: Beside each repo's fp32 graph: the same graph converted to fp16, inputs and outputs included.
FP16_GRAPH = "onnx/model_fp16_fused.onnx"
Q4F16_GRAPH = "onnx/model_q4f16_rtn_sym.onnx"


def build_tokenizer():  # type: ignore[no-untyped-def]
    """A byte-level BPE without merges (every byte one token) plus the chat and mask specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIALS))
    assert tokenizer.get_vocab_size() == VOCAB and tokenizer.token_to_id("[MASK]") == MASK_ID
    assert [tokenizer.encode(chr(c)).ids[0] for c in (32, 33, 126)] == [READABLE[-1], 0, 93]
    return tokenizer


def torch_model(kind: str) -> tiny_diffusion.TinyDiffusionLM:
    """The torch model a fixture repo was exported from (same seed, same weights)."""
    return tiny_diffusion.TinyDiffusionLM(KINDS[kind]).eval()


def write_fp16(source: Path, target: Path) -> None:
    """Convert an fp32 graph to fp16 with onnxruntime's converter; float inputs and outputs become fp16 too."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    converted = convert_float_to_float16(onnx.load(str(source)), keep_io_types=False)
    onnx.save(converted, str(target))


def q4f16_copy(kind: str, folder: Path) -> Path:
    """A copy of a fixture repo in ``folder`` whose only graph is 4-bit RTN symmetric (blocks of 32) over fp16.

    Made as the q4f16 exports are: the fp16 graph's MatMul weights quantized by onnxruntime's
    MatMulNBitsQuantizer. Not cached: it takes a fraction of a second.
    """
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer, RTNWeightOnlyQuantConfig

    source = fixture_repo(kind)
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.onnx"), dirs_exist_ok=True)
    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(source / FP16_GRAPH)), block_size=32, is_symmetric=True, algo_config=RTNWeightOnlyQuantConfig()
    )
    quantizer.process()
    onnx.save(quantizer.model.model, str(folder / Q4F16_GRAPH))
    return folder


def _recipe_hash(kind: str) -> str:
    import onnx
    import torch

    digest = hashlib.sha256()
    here = Path(__file__).parent
    for name in ("kohra_fixtures.py", "tiny_diffusion.py"):
        digest.update((here / name).read_bytes())
    digest.update(f"{kind}|{torch.__version__}|{onnx.__version__}".encode())
    return digest.hexdigest()[:16]


def _card(blocks: bool) -> str:
    tags = ["text-diffusion", "block-diffusion"] if blocks else ["text-diffusion"]
    lines = "".join(f"  - {t}\n" for t in tags)
    kind = "BD3LM" if blocks else "MDLM"
    return f"---\nlicense: apache-2.0\npipeline_tag: text-generation\ntags:\n{lines}---\n# tiny random {kind}\n"


def write_repo(folder: Path, config: tiny_diffusion.TinyConfig, *, blocks: bool) -> None:
    """Write a text-diffusion repo for ``config`` into the empty ``folder``: graphs, tokenizer, config, card."""
    (folder / "onnx").mkdir()
    tiny_diffusion.export_onnx(tiny_diffusion.TinyDiffusionLM(config).eval(), str(folder / "onnx" / "model.onnx"))
    write_fp16(folder / "onnx" / "model.onnx", folder / FP16_GRAPH)
    build_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"mask_token": "[MASK]", "eos_token": "<|im_end|>", "bos_token": None}), encoding="utf-8"
    )
    model_config = {
        "model_type": "tiny-dit",
        "vocab_size": VOCAB,
        "hidden_size": config.hidden,
        "num_attention_heads": config.heads,
        "model_length": MODEL_LENGTH,
    }
    if blocks:
        model_config["block_size"] = BLOCK_SIZE
    (folder / "config.json").write_text(json.dumps(model_config), encoding="utf-8")
    (folder / "README.md").write_text(_card(blocks), encoding="utf-8")


def fixture_repo(kind: str) -> Path:
    """The local repo folder of a tiny model (a key of :data:`KINDS`), built once."""
    root = Path(os.environ.get("ANYFORMER_TEST_FIXTURES", Path.home() / ".cache" / "anyformer-test-fixtures"))
    target = root / f"kohra-{kind}-{_recipe_hash(kind)}"
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".kohra-{kind}-", dir=root))
    try:
        write_repo(staging, KINDS[kind], blocks=kind in BLOCK_KINDS)
        try:
            staging.rename(target)
        except OSError:
            if not target.is_dir():  # another run won the race: keep theirs
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
