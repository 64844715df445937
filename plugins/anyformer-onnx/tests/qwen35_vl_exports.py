"""A tiny Qwen3.5 with images (``Qwen3_5ForConditionalGeneration``) exported one graph per module, torch's answers.

The layout is the one onnx-community gives Qwen3.5 (transformers.js's ``qwen3_5``):

- ``vision_encoder``: ``pixel_values`` [patches, 3 * temporal * patch²] and ``grid_thw`` [1, 3] →
  ``image_features`` [tokens, hidden]: the patch embedding, the learned position table resampled
  bilinearly to the image's grid (what Qwen3.5's tower adds that Qwen2-VL's has not), the blocks
  with their 2-D rotary rows, and the patch merger;
- ``embed_tokens``: ``input_ids`` → ``inputs_embeds``;
- ``decoder_model_merged``: the hybrid decoder of :func:`per_layer_exports.export_hybrid_decoder`
  reading ``inputs_embeds``, ``position_ids`` [3, batch, seq] (the rotary rows interleaved over
  T/H/W inside the graph, as the model's ``mrope_section`` says) and the linear-attention states.

reference.json holds, per question of :data:`QWEN35_VL_PROMPTS`: the prompt transformers renders
(the chat template given the blocks, each ``<|image_pad|>`` expanded by Qwen3VLProcessor's own
rule), the model's ``get_rope_index`` rows and delta, torch's greedy reply and its logits at every
step; ``prompt_embeds{i}.npy`` the decoder's input for question ``i`` (image rows spliced in);
``torch_weights.safetensors`` the model's weights.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

from onnx_exports import (
    QWEN_VL_BLOCK_TEMPLATE,
    QWEN_VL_TOKENS,
    _char_tokenizer,
    _media_tokenizer,
    _quiet,
    _test_images,
    _write_json,
    cached,
    export_embed_tokens,
    export_qwen_vision,
    greedy_reply,
)
from per_layer_exports import QWEN35_BLOCK, export_hybrid_decoder

#: Questions the fixture records torch's replies to: (image indices, text). The images are non-square.
QWEN35_VL_PROMPTS = (
    ((0,), "What is in the picture?"),
    ((2, 0), "Compare them."),
    ((1, 2), "Which is taller?"),
    ((), "Hello there"),
)
#: Tokens each recorded reply runs to.
QWEN35_VL_TOKENS_OUT = 10
#: The processor's pixel bounds (patch 16, merge 2: 4 to 10 image tokens per test image).
QWEN35_VL_PIXELS = (64 * 64, 32 * 32 * 10)


def export_qwen35_vision(model: Any, onnx: Path) -> None:
    """Export Qwen3.5's vision tower and merger as ``vision_encoder`` (:func:`onnx_exports.export_qwen_vision`).

    What Qwen3.5's tower adds to Qwen2-VL's, its learned position table resampled bilinearly to the
    image's grid, transformers computes from the grid in Python; here the taps and weights are
    tensor arithmetic on the patches' rows and columns and the grid, so one graph serves every grid.
    """
    import torch
    from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb_vision

    visual = model.model.visual
    side = visual.num_grid_per_side

    def taps(index: Any, size: Any) -> tuple[Any, Any]:
        # Bilinear with align_corners: patch i of n sits at i * (side - 1) / (n - 1) in the table.
        source = index.float() * (side - 1) / torch.clamp(size - 1, min=1).float()
        low = source.floor()
        frac = source - low
        low = low.long().clamp(0, side - 1)
        return torch.stack([low, (low + 1).clamp(max=side - 1)], -1), torch.stack([1 - frac, frac], -1)

    def add_positions(hidden: Any, rows: Any, cols: Any, grid_thw: Any) -> Any:
        row_taps, row_weights = taps(rows, grid_thw[0, 1])
        col_taps, col_weights = taps(cols, grid_thw[0, 2])
        count = hidden.shape[0]
        table = (row_taps[:, :, None] * side + col_taps[:, None, :]).reshape(count, 4)
        weights = (row_weights[:, :, None] * col_weights[:, None, :]).reshape(count, 4)
        return hidden + (visual.pos_embed(table) * weights[:, :, None]).sum(1)

    export_qwen_vision(model, onnx, apply_rotary_pos_emb_vision, add_positions)


def _expand(text: str, grids: list[list[int]], processor: Any, tokenizer: Any) -> list[int]:
    """The rendered prompt's ids with each ``<|image_pad|>`` expanded by Qwen3VLProcessor's own rule."""
    import torch
    from transformers import Qwen3VLProcessor

    # Qwen3VLProcessor cannot be built without torchvision (its video processor); its expansion rule reads only
    # the image processor's merge size and the grids, so it is called on a stand-in holding those.
    holder = types.SimpleNamespace(image_processor=processor, image_token=QWEN_VL_TOKENS[2])
    inputs = {"image_grid_thw": torch.tensor(grids)} if grids else {}
    parts = text.split(QWEN_VL_TOKENS[2])
    expanded = parts[0]
    for index, part in enumerate(parts[1:]):
        expanded += Qwen3VLProcessor.replace_image_token(holder, inputs, index) + part
    return [int(t) for t in tokenizer(expanded, add_special_tokens=False)["input_ids"]]


def build_tiny_qwen35_vl(folder: Path) -> None:
    """A random Qwen3.5 with images: 2-block vision tower (patch 16), 4 hybrid decoder layers, characters."""
    import numpy as np
    import torch
    from PIL import Image
    from safetensors.torch import save_file
    from transformers import PreTrainedTokenizerFast, Qwen3_5Config, Qwen3_5ForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = _media_tokenizer(folder, QWEN_VL_TOKENS)
    (folder / "chat_template.jinja").write_text(QWEN_VL_BLOCK_TEMPLATE, encoding="utf-8")
    start, end, image_id, video_id = (tokenizer.token_to_id(t) for t in QWEN_VL_TOKENS)
    torch.manual_seed(0)
    text = {
        "vocab_size": tokenizer.get_vocab_size(),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 8,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
        "max_position_embeddings": 512,
        # Rotary over 8 of each head's 16 dims: 4 frequencies, interleaved T H W T (mrope_section 2, 1, 1); a small
        # theta turns them fast, so rows an image's height and width tokens disagree on move the logits visibly.
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 100.0,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
            "partial_rotary_factor": 0.5,
        },
        "bos_token_id": None,
        "eos_token_id": 2,
        "pad_token_id": 2,
    }
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 64,
        "num_position_embeddings": 16,  # a 4 x 4 table, resampled to every grid
    }
    config = Qwen3_5Config(
        text_config=text,
        vision_config=vision,
        image_token_id=image_id,
        video_token_id=video_id,
        vision_start_token_id=start,
        vision_end_token_id=end,
        architectures=["Qwen3_5ForConditionalGeneration"],
    )
    config._attn_implementation = "eager"
    model = Qwen3_5ForConditionalGeneration(config).eval()
    with torch.no_grad():  # random init leaves norms at one or zero and a flat position table; make them matter
        for name, weight in model.named_parameters():
            if (weight.ndim == 1 and "A_log" not in name) or "pos_embed" in name:
                weight.add_(torch.randn_like(weight) * 0.2)
    config.save_pretrained(folder)
    _write_json(folder / "generation_config.json", {"eos_token_id": 2, "pad_token_id": 2})
    processor = Qwen2VLImageProcessorPil(
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        min_pixels=QWEN35_VL_PIXELS[0],
        max_pixels=QWEN35_VL_PIXELS[1],
    )
    processor.save_pretrained(folder)
    images = _test_images(folder)
    # tokenizer.json's own pipeline: AutoTokenizer would pick Qwen3_5Tokenizer for model_type qwen3_5, which
    # rebuilds a byte-level BPE around the vocabulary and drops the character vocabulary's spaces.
    chat = PreTrainedTokenizerFast.from_pretrained(str(folder))
    replies = []
    seen: list[Any] = []
    hook = model.model.language_model.register_forward_pre_hook(
        lambda _, args, kwargs: seen.append(kwargs["inputs_embeds"]), with_kwargs=True
    )
    with _quiet(), torch.no_grad():
        for number, (pictures, question) in enumerate(QWEN35_VL_PROMPTS):
            blocks: list[dict[str, Any]] = [{"type": "image"} for _ in pictures]
            messages = [{"role": "user", "content": [*blocks, {"type": "text", "text": question}]}]
            rendered = chat.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            inputs: dict[str, Any] = {}
            grids: list[list[int]] = []
            if pictures:
                found = processor(
                    images=[Image.open(folder / images[i]).convert("RGB") for i in pictures], return_tensors="pt"
                )
                inputs = {"pixel_values": found["pixel_values"], "image_grid_thw": found["image_grid_thw"]}
                grids = found["image_grid_thw"].tolist()
            ids = _expand(rendered, grids, processor, chat)
            assert len(ids) <= QWEN35_BLOCK, "a prompt the decoder cannot take in one step"
            input_ids = torch.tensor([ids])
            inputs.update(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
            positions, delta = None, 0
            if pictures:
                inputs["mm_token_type_ids"] = (input_ids == image_id).int()
                rows, deltas = model.model.get_rope_index(
                    input_ids,
                    mm_token_type_ids=inputs["mm_token_type_ids"],
                    image_grid_thw=inputs["image_grid_thw"],
                    attention_mask=inputs["attention_mask"],
                )
                positions, delta = rows[:, 0].tolist(), int(deltas[0, 0])
            seen.clear()
            reply = greedy_reply(model, inputs, len(ids), QWEN35_VL_TOKENS_OUT, pad=2)
            np.save(folder / f"prompt_embeds{number}.npy", seen[0][0].numpy())
            replies.append(
                {
                    "images": [images[i] for i in pictures],
                    "question": question,
                    "prompt_ids": ids,
                    "grids": grids,
                    "positions": positions,
                    "delta": delta,
                    **reply,
                }
            )
    hook.remove()
    # The weights, for tests that run torch's decoder with a rotary layout other than the model's.
    save_file({name: value.clone() for name, value in model.state_dict().items()}, folder / "torch_weights.safetensors")
    onnx = folder / "onnx"
    export_qwen35_vision(model, onnx)
    export_embed_tokens(model, onnx)
    # The decoder export reads a causal LM's config, text model and head: the language model's, with this model's head.
    text_model = types.SimpleNamespace(
        config=config.text_config, model=model.model.language_model, lm_head=model.lm_head
    )
    export_hybrid_decoder(text_model, onnx / "decoder_model_merged.onnx", embeds=True)
    _write_json(folder / "reference.json", {"replies": replies})


def tiny_qwen35_vl() -> Path:
    """The cached tiny Qwen3.5 with images, one graph per module (seconds to export)."""
    return cached(
        "tiny-qwen35-vl",
        build_tiny_qwen35_vl,
        _char_tokenizer,
        _media_tokenizer,
        _test_images,
        _expand,
        export_qwen35_vision,
        export_qwen_vision,
        export_embed_tokens,
        greedy_reply,
        export_hybrid_decoder,
        extra=[QWEN35_VL_PROMPTS, QWEN35_VL_TOKENS_OUT, QWEN35_VL_PIXELS, QWEN_VL_BLOCK_TEMPLATE, QWEN_VL_TOKENS],
    )
