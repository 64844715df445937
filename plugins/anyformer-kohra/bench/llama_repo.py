"""A random autoregressive decoder (transformers' Llama) the size of the bench's diffusion model, as an ONNX repo.

The onnx backend (``anyformer-onnx``) runs it, so the bench can set kohra's tok/s against that back
end's own decode. The graph has optimum's names (``input_ids``, ``attention_mask``, ``position_ids``,
``past_key_values.{i}.key/value`` in, ``logits`` and ``present.{i}.key/value`` out) and a dynamic cache;
the tokenizer is the kohra fixtures' byte-level one with ChatML. The head's rows for the special
tokens are zeroed, so the greedy decode never ends early on a random end token and every run decodes
the same number of tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from kohra_fixtures import IM_END_ID, VOCAB, build_tokenizer

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _export(model: Any, path: Path) -> None:
    import torch
    from transformers import DynamicCache

    config = model.config
    layers = config.num_hidden_layers
    head_dim = config.hidden_size // config.num_attention_heads
    names = [f"{i}.{part}" for i in range(layers) for part in ("key", "value")]

    class Step(torch.nn.Module):
        """One decode call: new ids against the cache, returning logits and the grown cache."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, *past: Any) -> Any:
            cache = DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(layers)], config=config)
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            )
            return (out.logits, *[t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)])

    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {0: "batch", 1: "sequence"},
        "logits": {0: "batch", 1: "sequence"},
    }
    for name in names:
        axes[f"past_key_values.{name}"] = {0: "batch", 2: "past"}
        axes[f"present.{name}"] = {0: "batch", 2: "total"}
    # Two new positions after three cached ones, so neither length is traced as a constant.
    past = [torch.zeros(1, config.num_key_value_heads, 3, head_dim) for _ in names]
    example = (torch.tensor([[1, 2]]), torch.ones(1, 5, dtype=torch.int64), torch.tensor([[3, 4]]), *past)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            Step().eval(),
            example,
            str(path),
            input_names=["input_ids", "attention_mask", "position_ids", *(f"past_key_values.{n}" for n in names)],
            output_names=["logits", *(f"present.{n}" for n in names)],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )


def write_llama_repo(folder: Path, *, hidden: int, layers: int, heads: int) -> Path:
    """Write the decoder repo into ``folder`` (created) and return it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=1024,
        bos_token_id=None,
        eos_token_id=IM_END_ID,
        pad_token_id=IM_END_ID,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight[256:] = 0.0
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(folder)
    build_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "bos_token": None, "chat_template": CHATML}), encoding="utf-8"
    )
    _export(model, folder / "onnx" / "model.onnx")
    return folder
