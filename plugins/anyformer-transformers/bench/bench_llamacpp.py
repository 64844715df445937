"""The backend's decode speed against llama.cpp on a GGUF converted from the same weights (reported, not a target).

A random llama in SmolLM2-135M's shapes (float32) is saved as safetensors, and the same tensors are
written to a float32 GGUF with gguf's writer (llama's names; the query and key rows reordered for
llama.cpp's rotary layout, as its converter does). Both get the chat prompt's token ids; the first
``--check`` greedy tokens are compared and the prompt's last logits (the conversion is right when
they agree to float32 rounding; a random model's near-ties may still turn greedy paths apart),
then each round times a greedy
reply of ``--tokens`` tokens through ``anyformer.load(...).generate`` and through a llama-cpp-python
eval loop (argmax of each step's logits), interleaved, both on ``--threads`` threads.

    nice -n -10 python plugins/anyformer-transformers/bench/bench_llamacpp.py --tokens 64 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_overhead import SMOLLM2_SHAPE
from tiny_models import EOS_ID, build_llama

#: HF llama tensor names → GGUF names (per layer: ``{i}``).
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _rotary_rows(weight: Any, heads: int) -> Any:
    """Query/key rows from transformers' half-split rotary layout to llama.cpp's interleaved one."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def write_gguf(folder: Path, path: Path) -> None:
    """The safetensors llama in ``folder`` as a float32 GGUF at ``path`` (its character vocabulary as tokens)."""
    import json

    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    tensors = load_file(str(folder / "model.safetensors"))
    vocab = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    tokens = [name for name, _ in sorted(vocab.items(), key=lambda item: item[1])]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(float(config.get("rope_theta") or config.get("rope_parameters", {}).get("rope_theta")))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    writer.add_token_types(types + [gguf.TokenType.NORMAL] * (len(tokens) - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(EOS_ID)
    writer.add_add_bos_token(False)
    writer.add_tensor("token_embd.weight", tensors["model.embed_tokens.weight"].astype(np.float32))
    writer.add_tensor("output_norm.weight", tensors["model.norm.weight"].astype(np.float32))
    if "lm_head.weight" in tensors:
        writer.add_tensor("output.weight", tensors["lm_head.weight"].astype(np.float32))
    for layer in range(config["num_hidden_layers"]):
        for name, gguf_name in _LAYER_NAMES.items():
            weight = tensors[f"model.layers.{layer}.{name}"].astype(np.float32)
            if name.startswith("self_attn.q_proj"):
                weight = _rotary_rows(weight, config["num_attention_heads"])
            elif name.startswith("self_attn.k_proj"):
                weight = _rotary_rows(weight, config["num_key_value_heads"])
            writer.add_tensor(f"blk.{layer}.{gguf_name}", np.ascontiguousarray(weight))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llama_cpp_reply(llm: Any, prompt: list[int], tokens: int) -> list[int]:
    """llama.cpp's greedy continuation of ``prompt``: ``tokens`` ids, the end token not stopping it."""
    import numpy as np

    llm.reset()
    llm.eval(prompt)
    out: list[int] = []
    for _ in range(tokens):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(token)
        llm.eval([token])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--check", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--results", type=Path, default=None)
    args = parser.parse_args()

    import torch
    from llama_cpp import Llama

    import anyformer

    torch.set_num_threads(args.threads)
    lines = [f"command: {' '.join(['python', *sys.argv])} (niceness {os.nice(0)})"]
    lines.append(f"threads {args.threads}, load average before {os.getloadavg()[0]:.1f}")
    for line in lines:
        print(line)
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_llama(Path(tmp) / "smollm2-shapes", **SMOLLM2_SHAPE)
        write_gguf(folder, Path(tmp) / "same.gguf")
        # logits_all: llama-cpp-python keeps the last logits at scores[n_tokens - 1] only then.
        llm = Llama(str(Path(tmp) / "same.gguf"), n_ctx=512, n_threads=args.threads, verbose=False, logits_all=True)
        with anyformer.load(folder, backend="transformers", isolate=False) as model:
            handle: Any = model.handle
            prompt = handle.text.prompt_ids(messages, False)
            ours_ids = handle.text.tokenizer(
                "".join(c.delta for c in model.generate(messages, max_new_tokens=args.check)),
                add_special_tokens=False,
            )["input_ids"]
            theirs_ids = llama_cpp_reply(llm, prompt, args.check)
            agree = next(
                (i for i, (a, b) in enumerate(zip(ours_ids, theirs_ids, strict=False)) if a != b), len(ours_ids)
            )
            llm.reset()
            llm.eval(prompt)
            with torch.inference_mode():
                network = handle._network
                reference = network(input_ids=torch.tensor([prompt])).logits[0, -1].float().numpy()
            gap = float(abs(reference - llm.scores[llm.n_tokens - 1]).max())
            check = (
                f"prompt's next-token logits: max difference {gap:.2e} (largest {float(abs(reference).max()):.2f}); "
                f"greedy tokens agree for the first {agree} of {len(ours_ids)}"
            )
            print(check)
            lines.append(check)
            ratios = []
            for round_ in range(args.rounds):
                start = time.perf_counter()
                chunks = list(model.generate(messages, max_new_tokens=args.tokens))
                ours = chunks[-1].tokens / (time.perf_counter() - start)
                start = time.perf_counter()
                llama_cpp_reply(llm, prompt, args.tokens)
                theirs = args.tokens / (time.perf_counter() - start)
                ratios.append(ours / theirs)
                line = f"round {round_ + 1}: anyformer {ours:.1f} tok/s, llama.cpp {theirs:.1f} tok/s"
                line += f", ratio {ratios[-1]:.3f}"
                print(line)
                lines.append(line)
        llm.close()
    summary = (
        f"median ratio {statistics.median(ratios):.3f} (anyformer-transformers / llama.cpp, float32 both) over "
        f"{args.rounds} rounds of {args.tokens} tokens; load average after {os.getloadavg()[0]:.1f}"
    )
    print(summary)
    lines.append(summary)
    if args.results is not None:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
