"""Decoders whose steps carry more than embeddings and a KV cache, exported tiny, with torch's answers.

- :func:`tiny_gemma3n`: a Gemma 3n text decoder, one graph per module, with per-layer inputs
  (below);
- :func:`tiny_qwen35`: a Qwen3.5 hybrid decoder, one graph, whose linear-attention layers carry a
  convolution and a recurrent state from step to step (:func:`export_hybrid_decoder`).

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


def _greedy_references(model: Any, chat: Any, prompts: Any) -> list[dict[str, Any]]:
    """Per conversation: the prompt ids, torch's greedy reply (up to GEMMA3N_TOKENS, ending at id 2) and every
    step's logits, each step computed on the whole sequence without a cache (the reference for the cached loop)."""
    import torch

    replies = []
    with _quiet(), torch.no_grad():
        for messages in prompts:
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
    return replies


def export_per_layer_modules(model: Any, onnx: Path) -> None:
    """Export a Gemma 3n causal LM as ``embed_tokens`` (two outputs) and a decoder reading both."""
    config = model.config
    cached_layers = config.num_hidden_layers - config.num_kv_shared_layers
    shapes = [(config.num_key_value_heads, config.head_dim)] * cached_layers
    export_per_layer_text(model.model, model.lm_head, config, shapes, onnx)


def export_per_layer_text(text: Any, head: Any, config: Any, shapes: list[tuple[int, int]], onnx: Path) -> None:
    """Export a text model with per-layer inputs as ``embed_tokens`` (two outputs) and a decoder reading both.

    ``text``: the text model (Gemma 3n's or Gemma 4's: its ``embed_tokens``, ``get_per_layer_inputs``
    and forward); ``head``: the LM head, its logits soft-capped as ``config`` (the text config) says;
    ``shapes``: (KV heads, head width) of each layer with a cache of its own (the KV-sharing layers
    after them read those).
    """
    import torch
    from transformers import DynamicCache

    cached_layers = len(shapes)

    class Embed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.text = text

        def forward(self, input_ids: Any) -> Any:
            return self.text.embed_tokens(input_ids), self.text.get_per_layer_inputs(input_ids)

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.text, self.head = text, head

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
        past = [torch.randn(1, heads, 3, width) for heads, width in shapes for _ in range(2)]
        example = (
            torch.randn(1, 2, config.hidden_size),
            torch.randn(1, 2, config.num_hidden_layers, config.hidden_size_per_layer_input),
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
    replies = _greedy_references(model, AutoTokenizer.from_pretrained(str(folder)), GEMMA3N_PROMPTS)
    export_per_layer_modules(model, folder / "onnx")
    _write_json(folder / "reference.json", {"replies": replies})


def tiny_gemma3n() -> Path:
    """The cached tiny Gemma 3n, one graph per module (some seconds to export)."""
    return cached(
        "tiny-gemma3n",
        build_tiny_gemma3n,
        _char_tokenizer,
        _greedy_references,
        export_per_layer_modules,
        export_per_layer_text,
        extra=[GEMMA3N_PROMPTS, GEMMA3N_TOKENS, PER_LAYER_VOCAB],
    )


# ---- Qwen3.5: a hybrid decoder with linear-attention states ------------------------------------------

#: Conversations whose greedy replies and step logits the Qwen3.5 fixture records.
QWEN35_PROMPTS = GEMMA3N_PROMPTS
#: The export's delta-rule block: every step's tokens are padded to it (prompt plus reply stay inside).
QWEN35_BLOCK = 64


def export_hybrid_decoder(model: Any, path: Path, *, embeds: bool = False, block_size: int = QWEN35_BLOCK) -> None:
    """Export a Qwen3.5 causal LM as one graph with transformers.js's cache names: KV pairs and layer states.

    ``input_ids`` (``inputs_embeds`` [batch, seq, hidden] with ``embeds``: the decoder of a per-module
    export), ``attention_mask``, ``position_ids`` [3, batch, seq], ``past_key_values.i.key/value``
    for the full-attention layers and ``past_conv.i`` / ``past_recurrent.i`` for the linear-attention
    ones → ``logits``, ``present.i.key/value``, ``present_conv.i``, ``present_recurrent.i``.

    transformers picks a prefill or a one-token kernel in Python, which a trace would freeze; here a
    linear-attention layer runs one formulation for any step: the convolution over the carried
    inputs and the new ones, and the token-by-token delta rule (transformers' own function, which a
    trace unrolls) from the carried state over the step padded to ``block_size`` positions
    (zero ``beta`` and decay leave the state as it is over the padding), so a step carries at most
    that many tokens. Weights and the other modules are the model's own; the test compares
    against torch without a cache.
    """
    import torch
    import torch.nn.functional as F
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

    config = model.config
    kinds = list(config.layer_types)
    text = model.model

    def linear(layer: Any, hidden: Any, conv: Any, state: Any) -> tuple[Any, Any, Any]:
        net = layer.linear_attn
        batch, steps, _ = hidden.shape
        mixed = net.in_proj_qkv(hidden).transpose(1, 2)
        window = torch.cat([conv, mixed], dim=-1)
        new_conv = window[:, :, -net.conv_kernel_size :]
        weight = net.conv1d.weight
        mixed = F.silu(F.conv1d(window, weight, None, groups=net.conv_dim)[:, :, -steps:]).transpose(1, 2)
        query, key, value = torch.split(mixed, [net.key_dim, net.key_dim, net.value_dim], dim=-1)
        query = query.reshape(batch, steps, -1, net.head_k_dim)
        key = key.reshape(batch, steps, -1, net.head_k_dim)
        value = value.reshape(batch, steps, -1, net.head_v_dim)
        beta = net.in_proj_b(hidden).sigmoid()
        decay = -net.A_log.float().exp() * F.softplus(net.in_proj_a(hidden).float() + net.dt_bias)

        def block(x: Any) -> Any:  # pad the step to one block along the sequence axis
            pad = torch.zeros((x.shape[0], block_size, *x.shape[2:]), dtype=x.dtype)
            return torch.cat([x, pad], dim=1)[:, :block_size]

        out, new_state = torch_recurrent_gated_delta_rule(
            block(query),
            block(key),
            block(value),
            g=block(decay),
            beta=block(beta),
            initial_state=state,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        out = out[:, :steps].reshape(-1, net.head_v_dim)
        gate = net.in_proj_z(hidden).reshape(-1, net.head_v_dim)
        out = net.norm(out, gate).reshape(batch, steps, -1)
        return net.out_proj(out), new_conv, new_state

    class Past:
        """The two tensors transformers' attention asks a cache to extend, for one layer."""

        def __init__(self, key: Any, value: Any) -> None:
            self.key, self.value = key, value

        def update(self, key: Any, value: Any, layer: int, **_: Any) -> tuple[Any, Any]:
            self.key, self.value = torch.cat([self.key, key], dim=2), torch.cat([self.value, value], dim=2)
            return self.key, self.value

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.text = text
            self.head = model.lm_head

        def forward(self, tokens: Any, attention_mask: Any, position_ids: Any, *carried: Any) -> Any:
            hidden = tokens if embeds else self.text.embed_tokens(tokens)
            steps = hidden.shape[1]
            # Causal mask over the whole sequence: key k is visible to query q when k <= q.
            keys = attention_mask.cumsum(-1) - 1
            queries = keys[:, -steps:]
            hidden_mask = keys[:, None, None, :] > queries[:, None, :, None]
            mask = torch.zeros(hidden_mask.shape, dtype=hidden.dtype).masked_fill(hidden_mask, -1e9)
            rope = self.text.rotary_emb(hidden, position_ids)
            presents: list[Any] = []
            pending = iter(carried)
            for layer, kind in zip(self.text.layers, kinds, strict=True):
                first, second = next(pending), next(pending)
                normed = layer.input_layernorm(hidden)
                if kind == "linear_attention":
                    mixed, conv, state = linear(layer, normed, first, second)
                    presents += [conv, state]
                else:
                    past = Past(first, second)
                    mixed, _ = layer.self_attn(normed, position_embeddings=rope, attention_mask=mask, cache=past)
                    presents += [past.key, past.value]
                hidden = hidden + mixed
                hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
            return (self.head(self.text.norm(hidden)), *presents)

    ins, outs, example = [], [], []
    first = "inputs_embeds" if embeds else "input_ids"
    axes: dict[str, dict[int, str]] = {
        first: {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {1: "batch", 2: "sequence"},
        "logits": {0: "batch", 1: "sequence"},
    }
    heads, width = config.num_key_value_heads, config.head_dim
    net_conv = 2 * config.linear_num_key_heads * config.linear_key_head_dim
    net_conv += config.linear_num_value_heads * config.linear_value_head_dim
    recurrent = (config.linear_num_value_heads, config.linear_key_head_dim, config.linear_value_head_dim)
    for i, kind in enumerate(kinds):
        if kind == "linear_attention":
            ins += [f"past_conv.{i}", f"past_recurrent.{i}"]
            outs += [f"present_conv.{i}", f"present_recurrent.{i}"]
            example += [torch.randn(1, net_conv, config.linear_conv_kernel_dim), torch.randn(1, *recurrent) * 0.1]
            axes.update({n: {0: "batch"} for n in (*ins[-2:], *outs[-2:])})
        else:
            ins += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
            outs += [f"present.{i}.key", f"present.{i}.value"]
            example += [torch.randn(1, heads, 3, width) for _ in range(2)]
            axes.update({n: {0: "batch", 2: "past"} for n in ins[-2:]})
            axes.update({n: {0: "batch", 2: "total"} for n in outs[-2:]})
    path.parent.mkdir(parents=True, exist_ok=True)
    with _quiet(), torch.no_grad():
        # Traced with 3 cached and 2 new positions so that neither length is a constant in the graph.
        torch.onnx.export(
            Decoder().eval(),
            (
                torch.randn(1, 2, config.hidden_size) if embeds else torch.tensor([[5, 6]]),
                torch.ones(1, 5, dtype=torch.int64),
                torch.tensor([[[3, 4]]] * 3),
                *example,
            ),
            str(path),
            input_names=[first, "attention_mask", "position_ids", *ins],
            output_names=["logits", *outs],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )


def build_tiny_qwen35(folder: Path) -> None:
    """A random 4-layer Qwen3.5 text model (three linear-attention layers, one full) over characters.

    reference.json holds, per conversation: transformers' prompt ids, torch's greedy reply and every
    step's logits, each on the whole sequence so far without a cache.
    """
    import torch
    from transformers import AutoTokenizer, Qwen3_5ForCausalLM, Qwen3_5TextConfig

    tokenizer = _char_tokenizer(folder)
    torch.manual_seed(0)
    config = Qwen3_5TextConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        max_position_embeddings=512,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
            "partial_rotary_factor": 0.5,
        },
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=2,
        architectures=["Qwen3_5ForCausalLM"],
    )
    config._attn_implementation = "eager"
    model = Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():  # random init leaves norms at one or zero; give them values that matter
        for name, weight in model.named_parameters():
            if weight.ndim == 1 and "A_log" not in name:
                weight.add_(torch.randn_like(weight) * 0.2)
    config.save_pretrained(folder)
    _write_json(folder / "generation_config.json", {"eos_token_id": 2, "pad_token_id": 2})
    replies = _greedy_references(model, AutoTokenizer.from_pretrained(str(folder)), QWEN35_PROMPTS)
    export_hybrid_decoder(model, folder / "onnx" / "model.onnx")
    _write_json(folder / "reference.json", {"replies": replies})


def tiny_qwen35() -> Path:
    """The cached tiny Qwen3.5 hybrid decoder, one graph (some seconds to export)."""
    return cached(
        "tiny-qwen35",
        build_tiny_qwen35,
        _char_tokenizer,
        _greedy_references,
        export_hybrid_decoder,
        extra=[QWEN35_PROMPTS, GEMMA3N_TOKENS, QWEN35_BLOCK],
    )
