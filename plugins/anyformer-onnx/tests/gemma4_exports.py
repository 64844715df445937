"""A tiny random Gemma 4 with a vision tower, exported one graph per module as onnx-community lays Gemma 4 out.

- ``embed_tokens``: ``input_ids`` → ``inputs_embeds`` (the scaled word embedding) and
  ``per_layer_inputs`` [batch, seq, layers, per_layer_width] (the scaled per-layer table's rows);
- ``vision_encoder``: ``pixel_values`` [1, max_patches, 3 * patch**2] and ``pixel_position_ids``
  [1, max_patches, 2] (the image processor's padded patches and their (x, y), padding at -1) →
  ``image_features`` [soft tokens, text hidden] (the vision tower, its pooler, the padding rows
  dropped, and the multimodal embedder's projection);
- ``decoder_model_merged``: ``inputs_embeds``, ``per_layer_inputs``, ``attention_mask``,
  ``position_ids``, ``past_key_values.N.key/value`` → ``logits``, ``present.N.key/value`` (the
  per-layer projection and mix happen inside, as in transformers' ``project_per_layer_inputs``).

reference.json holds, per prompt of :data:`GEMMA4_PROMPTS`: the messages, the prompt ids
transformers' ``Gemma4Processor`` gives for them (its chat template, then each image token
expanded to ``<|image>`` + one ``<|image|>`` per soft token + ``<image|>``), torch's greedy reply
from ``generate`` with the processor's pixels and the logits of every step. ``inputs{i}.npz`` holds
the prompt's ``inputs_embeds`` and ``per_layer_inputs`` as the language model received them, and
``pixels{i}.npz`` the processor's ``pixel_values`` and ``image_position_ids`` for test image i,
``clip{i}.npy`` the samples of clip i and ``features{i}.npz`` the feature extractor's
``input_features`` and ``input_features_mask`` for it.

- ``audio_encoder``: ``input_features`` [1, frames, 128] and ``input_features_mask`` [1, frames]
  (bool) → ``audio_features`` [audio tokens, text hidden] (the audio tower and the multimodal
  embedder's projection, the rows of padding frames dropped). transformers' tower builds its
  attention mask with vmap and cuts each block's context with ``unfold``, neither of which the
  exporter traces at a free length; the export builds the same mask with tensor arithmetic and the
  same context windows with a gather (the test compares the graph with torch's own ``generate``).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from onnx_exports import _media_tokenizer, _quiet, _test_images, _write_json, cached, greedy_reply
from per_layer_exports import export_per_layer_text

#: Gemma 4's media tokens: image, begin and end of image, audio, begin and end of audio, video.
GEMMA4_TOKENS = ("<|image|>", "<|image>", "<image|>", "<|audio|>", "<|audio>", "<audio|>", "<|video|>")
#: A Gemma-4-style template over the character vocabulary's ChatML tokens: each image block is the image token.
GEMMA4_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for b in m['content'] %}"
    "{% if b['type'] == 'image' %}<|image|>{% elif b['type'] == 'audio' %}<|audio|>"
    "{% else %}{{ b['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Questions whose replies the fixture records: (test image indices, clip indices, text).
GEMMA4_PROMPTS = (
    ((0,), (), "What is in the picture?"),
    ((2, 1), (), "Compare them."),
    ((), (), "Hello there"),
    ((), (0,), "What do you hear?"),
    ((1,), (1, 0), "Tell me everything."),
)
#: The recorded clips: (seconds, tone in Hz); 16 000 samples fill the extractor's 128-sample steps,
#: 23 300 do not (padded to 23 424, the last frame reaches the padding and is masked).
GEMMA4_CLIPS = ((1.0, 440.0), (23_300 / 16_000, 260.0))
#: Tokens each recorded reply runs to.
GEMMA4_TOKENS_OUT = 10
#: The image processor's soft-token budget (its smallest: 70 soft tokens, 630 patches of 16 pixels).
GEMMA4_SOFT_TOKENS = 70


@contextlib.contextmanager
def _processor_without_video() -> Iterator[Any]:
    """transformers' Gemma4Processor, built without its video processor (which needs torchvision).

    The processor checks each part's class at construction; images never touch the video part.
    """
    from transformers import Gemma4Processor

    check = Gemma4Processor.check_argument_for_proper_class
    Gemma4Processor.check_argument_for_proper_class = lambda self, name, value: None  # type: ignore[method-assign]
    try:
        yield Gemma4Processor
    finally:
        Gemma4Processor.check_argument_for_proper_class = check  # type: ignore[method-assign]


def export_gemma4_modules(model: Any, onnx: Path) -> None:
    """Export ``embed_tokens``, ``decoder_model_merged`` (:func:`per_layer_exports.export_per_layer_text`, with
    each cached layer's own KV heads and width), ``vision_encoder`` and ``audio_encoder`` (see the module docstring)."""
    import torch

    config = model.config.text_config
    cached_layers = config.num_hidden_layers - config.num_kv_shared_layers
    shapes = [
        (config.per_layer_config[i].num_key_value_heads, config.per_layer_config[i].head_dim)
        for i in range(cached_layers)
    ]
    export_per_layer_text(model.model.language_model, model.lm_head, config, shapes, onnx)

    class Vision(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tower, self.project = model.model.vision_tower, model.model.embed_vision

        def forward(self, pixel_values: Any, pixel_position_ids: Any) -> Any:
            rows = self.tower(pixel_values=pixel_values, pixel_position_ids=pixel_position_ids).last_hidden_state
            return self.project(inputs_embeds=rows)

    class Audio(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tower, self.project = model.model.audio_tower, model.model.embed_audio

        def forward(self, input_features: Any, input_features_mask: Any) -> Any:
            tower, settings = self.tower, self.tower.config
            hidden, real = tower.subsample_conv_projection(input_features, input_features_mask)
            positions = tower.rel_pos_enc(hidden)
            index = torch.arange(hidden.shape[1])
            gap = index[:, None] - index[None, :]  # query minus key
            near = ((gap >= 0) & (gap < settings.attention_context_left - 1)) | (
                (gap < 0) & (-gap < settings.attention_context_right)
            )
            allowed = near[None] & real[:, None, :]
            floor = torch.finfo(hidden.dtype).min
            mask = torch.zeros(allowed.shape, dtype=hidden.dtype).masked_fill(~allowed, floor)[:, None]
            mask = tower._convert_4d_mask_to_blocked_5d(mask)
            for layer in tower.layers:
                hidden = layer(hidden, attention_mask=mask, position_embeddings=positions)
            return self.project(inputs_embeds=tower.output_proj(hidden))[real]

    def block_context(attention: Any, hidden: Any) -> Any:
        """Each block's context window, as the attention's ``_extract_block_context`` cuts it, by a gather."""
        chunk = attention.chunk_size
        padded = torch.nn.functional.pad(
            hidden, (0, 0, 0, 0, attention.max_past_horizon, attention.max_future_horizon + chunk - 1)
        )
        blocks = (hidden.shape[1] + chunk - 1) // chunk
        index = torch.arange(blocks)[:, None] * chunk + torch.arange(attention.context_size)[None, :]
        return padded[:, index]

    vision = model.config.vision_config
    patches = GEMMA4_SOFT_TOKENS * vision.pooling_kernel_size**2
    with _quiet(), torch.no_grad():
        # Traced with padding (a 12 x 15 patch image in the 630 slots) so the padding strip is a real step.
        grid = torch.stack(torch.meshgrid(torch.arange(15), torch.arange(12), indexing="xy"), dim=-1).reshape(-1, 2)
        positions = torch.cat([grid, torch.full((patches - grid.shape[0], 2), -1)])[None]
        torch.onnx.export(
            Vision().eval(),
            (torch.rand(1, patches, 3 * vision.patch_size**2), positions),
            str(onnx / "vision_encoder.onnx"),
            input_names=["pixel_values", "pixel_position_ids"],
            output_names=["image_features"],
            dynamic_axes={
                "pixel_values": {0: "batch", 1: "patches"},
                "pixel_position_ids": {0: "batch", 1: "patches"},
                "image_features": {0: "tokens"},
            },
            opset_version=17,
            dynamo=False,
        )
        for layer in model.model.audio_tower.layers:
            layer.self_attn._extract_block_context = types.MethodType(block_context, layer.self_attn)
        frames = 147  # with its last frames padding
        torch.onnx.export(
            Audio().eval(),
            (torch.randn(1, frames, 128), torch.arange(frames)[None] < frames - 5),
            str(onnx / "audio_encoder.onnx"),
            input_names=["input_features", "input_features_mask"],
            output_names=["audio_features"],
            dynamic_axes={
                "input_features": {0: "batch", 1: "frames"},
                "input_features_mask": {0: "batch", 1: "frames"},
                "audio_features": {0: "tokens"},
            },
            opset_version=17,
            dynamo=False,
        )
        for layer in model.model.audio_tower.layers:
            del layer.self_attn._extract_block_context


def _gemma4_tokenizer(folder: Path) -> Any:
    """The character tokenizer with Gemma 4's media tokens, named in tokenizer_config.json for transformers."""
    import json

    tokenizer = _media_tokenizer(folder, GEMMA4_TOKENS)
    settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    names = ("image_token", "boi_token", "eoi_token", "audio_token", "boa_token", "eoa_token")
    settings.update(chat_template=GEMMA4_TEMPLATE, extra_special_tokens=dict(zip(names, GEMMA4_TOKENS, strict=False)))
    _write_json(folder / "tokenizer_config.json", settings)
    return tokenizer


def build_tiny_gemma4(folder: Path) -> None:
    """A random Gemma 4 (4-layer decoder with per-layer inputs and KV sharing, 2-layer vision and audio towers)."""
    import json

    import numpy as np
    import torch
    from PIL import Image
    from transformers import AutoTokenizer, Gemma4Config, Gemma4ForConditionalGeneration
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    tokenizer = _gemma4_tokenizer(folder)
    ids = [tokenizer.token_to_id(t) for t in GEMMA4_TOKENS]
    vocab = tokenizer.get_vocab_size()
    text = {
        "vocab_size": vocab,
        "vocab_size_per_layer_input": vocab,
        "hidden_size": 64,
        "hidden_size_per_layer_input": 16,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "global_head_dim": 32,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "num_kv_shared_layers": 2,
        "sliding_window": 512,
        "max_position_embeddings": 1024,
        "final_logit_softcapping": 30.0,
        "bos_token_id": None,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "patch_size": 16,
        "pooling_kernel_size": 3,
        "position_embedding_size": 256,
    }
    audio = {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "subsampling_conv_channels": [128, 8],
        "output_proj_dims": 32,
        "use_clipped_linears": False,
    }
    torch.manual_seed(0)
    config = Gemma4Config(
        text_config=text,
        vision_config=vision,
        audio_config=audio,
        image_token_id=ids[0],
        boi_token_id=ids[1],
        eoi_token_id=ids[2],
        audio_token_id=ids[3],
        boa_token_id=ids[4],
        eoa_token_index=ids[5],
        video_token_id=ids[6],
        architectures=["Gemma4ForConditionalGeneration"],
    )
    model = Gemma4ForConditionalGeneration(config).eval()
    with torch.no_grad():  # random init leaves norms at one and tables small; give them values that matter
        for name, weight in model.named_parameters():
            if weight.ndim == 1 or "per_layer" in name or "position_embedding" in name:
                weight.add_(torch.randn_like(weight) * 0.2)
    config.save_pretrained(folder)
    _write_json(folder / "generation_config.json", {"eos_token_id": 2, "pad_token_id": 0})
    images = _test_images(folder)
    pixels = Gemma4ImageProcessorPil(max_soft_tokens=GEMMA4_SOFT_TOKENS)
    # transformers 5 (and transformers.js) keep a Gemma 4 processor's parts in processor_config.json.
    generator = np.random.default_rng(3)
    extractor = Gemma4AudioFeatureExtractor(
        per_bin_mean=generator.normal(0, 0.5, 128).tolist(), per_bin_stddev=generator.uniform(0.5, 2, 128).tolist()
    )
    _write_json(
        folder / "processor_config.json",
        {
            "processor_class": "Gemma4Processor",
            "image_processor": {**pixels.to_dict(), "resample": 3},
            "feature_extractor": json.loads(extractor.to_json_string()),
        },
    )
    clips = []
    for index, (seconds, tone) in enumerate(GEMMA4_CLIPS):
        time = np.arange(round(seconds * 16_000)) / 16_000
        samples = (0.3 * np.sin(2 * np.pi * tone * time) + generator.normal(0, 0.05, time.shape)).astype(np.float32)
        np.save(folder / f"clip{index}.npy", samples)
        found = extractor([samples], return_tensors="np")
        np.savez(
            folder / f"features{index}.npz",
            input_features=found["input_features"][0],
            input_features_mask=found["input_features_mask"][0],
        )
        clips.append(samples)
    for index, name in enumerate(images):
        found = pixels(images=[Image.open(folder / name).convert("RGB")], return_tensors="np")
        np.savez(
            folder / f"pixels{index}.npz",
            pixel_values=found["pixel_values"][0],
            image_position_ids=found["image_position_ids"][0],
        )
    seen: dict[str, Any] = {}

    def record(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if "prompt" not in seen:
            seen["prompt"] = (kwargs["inputs_embeds"].numpy().copy(), kwargs["per_layer_inputs"].numpy().copy())

    model.model.language_model.register_forward_pre_hook(record, with_kwargs=True)
    replies = []
    with _quiet(), torch.no_grad(), _processor_without_video() as processor_class:
        processor = processor_class(
            feature_extractor=extractor,
            image_processor=pixels,
            tokenizer=AutoTokenizer.from_pretrained(str(folder)),
            video_processor=None,
            chat_template=GEMMA4_TEMPLATE,
        )
        for index, (pictures, sounds, question) in enumerate(GEMMA4_PROMPTS):
            content = [{"type": "image"} for _ in pictures] + [{"type": "audio"} for _ in sounds]
            messages = [{"role": "user", "content": [*content, {"type": "text", "text": question}]}]
            rendered = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            inputs = processor(
                text=rendered,
                images=[Image.open(folder / images[i]).convert("RGB") for i in pictures] or None,
                audio=[clips[i] for i in sounds] or None,
                return_tensors="pt",
            )
            inputs.pop("mm_token_type_ids", None)  # causal attention throughout (use_bidirectional_attention unset)
            seen.clear()
            prompt = [int(t) for t in inputs["input_ids"][0]]
            reply = greedy_reply(model, inputs, len(prompt), GEMMA4_TOKENS_OUT, pad=0)
            embeds, per_layer = seen["prompt"]
            np.savez(folder / f"inputs{index}.npz", inputs_embeds=embeds, per_layer_inputs=per_layer)
            replies.append(
                {
                    "images": [images[i] for i in pictures],
                    "clips": [f"clip{i}.npy" for i in sounds],
                    "question": question,
                    "prompt_ids": prompt,
                    **reply,
                }
            )
    export_gemma4_modules(model, folder / "onnx")
    _write_json(folder / "reference.json", {"replies": replies, "images": images})


def tiny_gemma4() -> Path:
    """The cached tiny Gemma 4 with vision, one graph per module (some seconds to export)."""
    return cached(
        "tiny-gemma4",
        build_tiny_gemma4,
        _gemma4_tokenizer,
        _media_tokenizer,
        _test_images,
        _processor_without_video,
        export_gemma4_modules,
        export_per_layer_text,
        greedy_reply,
        extra=[GEMMA4_TOKENS, GEMMA4_TEMPLATE, GEMMA4_PROMPTS, GEMMA4_CLIPS, GEMMA4_TOKENS_OUT, GEMMA4_SOFT_TOKENS],
    )
