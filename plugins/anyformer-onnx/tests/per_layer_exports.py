"""A tiny random Gemma 3n text decoder exported one graph per module, with torch's answers.

Gemma 3n (and Gemma 4's small models) feed every decoder layer a second, per-layer embedding of
the token beside the residual stream. transformers.js's exports split it the same way as the other
multimodal repos, with one more tensor between the graphs:

- ``embed_tokens``: ``input_ids`` → ``inputs_embeds`` [batch, seq, hidden] (the scaled word
  embedding) and ``per_layer_inputs`` [batch, seq, layers, per_layer_width] (the scaled per-layer
  table's rows, ids outside that table read as row 0);
- ``decoder_model_merged``: ``inputs_embeds``, ``per_layer_inputs``, ``attention_mask``,
  ``position_ids``, ``past_key_values.N.key/value`` → ``logits``, ``present.N.key/value`` (the
  projection of the embeddings into the per-layer space and its mix with ``per_layer_inputs``
  happen inside the decoder, as in transformers' ``project_per_layer_inputs``).

The tiny model keeps what makes the family different: AltUp's four streams, LAuReL, per-layer
inputs, sliding and full layers, KV sharing (its last two layers reuse the cache of the earlier
ones, so the decoder has past inputs for two of its four layers) and final logit soft-capping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from onnx_exports import _char_tokenizer, _quiet, _write_json, cached

#: Conversations whose greedy replies and step logits the fixture records.
GEMMA3N_PROMPTS = (
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}],
)
#: Tokens each recorded reply runs to.
GEMMA3N_TOKENS = 12
#: The per-layer table is smaller than the vocabulary: the ids above it read row 0 (as media tokens do).
PER_LAYER_VOCAB = 90


def export_per_layer_modules(model: Any, onnx: Path) -> None:
    """Export a Gemma 3n causal LM as ``embed_tokens`` (two outputs) and a decoder reading both."""
    import torch
    from transformers import DynamicCache

    config = model.config
    cached_layers = config.num_hidden_layers - config.num_kv_shared_layers
    kv_heads, head_dim = config.num_key_value_heads, config.head_dim

    class Embed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.text = model.model

        def forward(self, input_ids: Any) -> Any:
            return self.text.embed_tokens(input_ids), self.text.get_per_layer_inputs(input_ids)

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.text = model.model
            self.head = model.lm_head

        def forward(
            self, inputs_embeds: Any, per_layer_inputs: Any, attention_mask: Any, position_ids: Any, *past: Any
        ) -> Any:
            cache = DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(cached_layers)])
            out = self.text(
                inputs_embeds=inputs_embeds,
                per_layer_inputs=per_layer_inputs,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=cache,
                use_cache=True,
            )
            logits = self.head(out.last_hidden_state)
            cap = config.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
            present = [t for item in out.cache.layers for t in (item.keys, item.values)]
            return (logits, *present)

    onnx.mkdir(parents=True, exist_ok=True)
    kv = [f"{i}.{part}" for i in range(cached_layers) for part in ("key", "value")]
    axes: dict[str, dict[int, str]] = {
        "inputs_embeds": {0: "batch", 1: "sequence"},
        "per_layer_inputs": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {0: "batch", 1: "sequence"},
        "logits": {0: "batch", 1: "sequence"},
    }
    for n in kv:
        axes[f"past_key_values.{n}"] = {0: "batch", 2: "past"}
        axes[f"present.{n}"] = {0: "batch", 2: "total"}
    with _quiet(), torch.no_grad():
        torch.onnx.export(
            Embed().eval(),
            (torch.tensor([[1, 2, 3]]),),
            str(onnx / "embed_tokens.onnx"),
            input_names=["input_ids"],
            output_names=["inputs_embeds", "per_layer_inputs"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "sequence"},
                "inputs_embeds": {0: "batch", 1: "sequence"},
                "per_layer_inputs": {0: "batch", 1: "sequence"},
            },
            opset_version=17,
            dynamo=False,
        )
        # Traced with 3 cached and 2 new positions so that neither length is a constant in the graph.
        past = [torch.randn(1, kv_heads, 3, head_dim) for _ in kv]
        per_layer = torch.randn(1, 2, config.num_hidden_layers, config.hidden_size_per_layer_input)
        example = (
            torch.randn(1, 2, config.hidden_size),
            per_layer,
            torch.ones(1, 5, dtype=torch.int64),
            torch.tensor([[3, 4]]),
        )
        names = ["inputs_embeds", "per_layer_inputs", "attention_mask", "position_ids"]
        torch.onnx.export(
            Decoder().eval(),
            (*example, *past),
            str(onnx / "decoder_model_merged.onnx"),
            input_names=[*names, *(f"past_key_values.{n}" for n in kv)],
            output_names=["logits", *(f"present.{n}" for n in kv)],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )


def build_tiny_gemma3n(folder: Path) -> None:
    """A random 4-layer Gemma 3n text model over a character vocabulary, exported per module.

    reference.json holds, per conversation of :data:`GEMMA3N_PROMPTS`: transformers' prompt ids,
    torch's greedy reply and every step's logits, each computed on the whole sequence so far without
    a cache (so the reference does not share the cache logic under test).
    """
    import torch
    from transformers import AutoTokenizer, Gemma3nForCausalLM, Gemma3nTextConfig

    tokenizer = _char_tokenizer(folder)
    torch.manual_seed(0)
    config = Gemma3nTextConfig(
        vocab_size=tokenizer.get_vocab_size(),
        vocab_size_per_layer_input=PER_LAYER_VOCAB,
        hidden_size=64,
        hidden_size_per_layer_input=16,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        num_kv_shared_layers=2,
        sliding_window=512,
        laurel_rank=8,
        activation_sparsity_pattern=[0.0] * 4,
        max_position_embeddings=512,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=2,
        architectures=["Gemma3nForCausalLM"],
    )
    model = Gemma3nForCausalLM(config).eval()
    # Random init leaves some of the family's weights at zero or one; give them values that matter.
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if weight.ndim == 1 or "altup" in name or "per_layer" in name:
                weight.add_(torch.randn_like(weight) * 0.2)
    config.save_pretrained(folder)
    _write_json(folder / "generation_config.json", {"eos_token_id": 2, "pad_token_id": 2})
    chat = AutoTokenizer.from_pretrained(str(folder))
    replies = []
    with _quiet(), torch.no_grad():
        for messages in GEMMA3N_PROMPTS:
            rendered = chat.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
            ids = [int(t) for t in rendered["input_ids"]]
            sequence, reply, steps = list(ids), [], []
            for _ in range(GEMMA3N_TOKENS):
                logits = model(input_ids=torch.tensor([sequence]), use_cache=False).logits[0, -1]
                steps.append(logits.tolist())
                token = int(logits.argmax())
                reply.append(token)
                if token == 2:
                    break
                sequence.append(token)
            replies.append({"messages": messages, "prompt_ids": ids, "reply_ids": reply, "logits": steps})
    export_per_layer_modules(model, folder / "onnx")
    _write_json(folder / "reference.json", {"replies": replies})


def tiny_gemma3n() -> Path:
    """The cached tiny Gemma 3n, one graph per module (some seconds to export)."""
    return cached(
        "tiny-gemma3n",
        build_tiny_gemma3n,
        _char_tokenizer,
        export_per_layer_modules,
        extra=[GEMMA3N_PROMPTS, GEMMA3N_TOKENS, PER_LAYER_VOCAB],
    )
