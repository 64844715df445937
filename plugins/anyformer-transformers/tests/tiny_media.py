"""Tiny random vision and speech models saved as a Hub repo holds them, built from transformers' configs.

A ViT image classifier, a YOLOS detector, a SegFormer semantic segmenter, a DPT depth estimator
(each with its image processor's ``preprocessor_config.json``), a two-layer Whisper over a byte
vocabulary with Whisper's special tokens and three languages, and a LLaVA (CLIP vision tower, a
two-layer llama over the tests' character vocabulary, its processor and an image chat template).
Each builder seeds torch and takes well under a second; nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

LABELS = {0: "cat", 1: "dog", 2: "car", 3: "tree"}
_WHISPER_SPECIALS = (
    "<|endoftext|>",
    "<|startoftranscript|>",
    "<|en|>",
    "<|fr|>",
    "<|de|>",
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nocaptions|>",
    "<|notimestamps|>",
)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' save progress bars and warnings kept out of the test log."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        yield


def _labelled(**fields: Any) -> dict[str, Any]:
    return {**fields, "id2label": LABELS, "label2id": {name: i for i, name in LABELS.items()}}


def _spread(model: Any, scale: float = 0.5) -> Any:
    """Random values in every parameter that starts constant (YOLOS' detection tokens and position
    embeddings start at zero, which would make every query the same)."""
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.numel() > 1 and float(parameter.std()) == 0.0:
                parameter.normal_(0.0, scale)
    return model


def _save(model: Any, processor: Any, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with _quiet():
        model.save_pretrained(folder, safe_serialization=True)
        processor.save_pretrained(folder)
    return folder


def build_vit(folder: Path) -> Path:
    """A 2-layer ViT image classifier over 4 labels, 32x32 pixels."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(0)
    config = ViTConfig(
        **_labelled(
            image_size=32,
            patch_size=8,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
        )
    )
    return _save(ViTForImageClassification(config), ViTImageProcessor(size={"height": 32, "width": 32}), folder)


def build_yolos(folder: Path) -> Path:
    """A 2-layer YOLOS detector with 5 detection tokens over 4 labels (weights wide enough to vary the boxes)."""
    import torch
    from transformers import YolosConfig, YolosForObjectDetection, YolosImageProcessor

    torch.manual_seed(1)
    config = YolosConfig(
        **_labelled(
            image_size=[32, 32],
            patch_size=8,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            num_detection_tokens=5,
            initializer_range=0.5,
        )
    )
    processor = YolosImageProcessor(size={"shortest_edge": 32, "longest_edge": 48})
    return _save(_spread(YolosForObjectDetection(config)), processor, folder)


def build_segformer(folder: Path) -> Path:
    """A 2-block SegFormer semantic segmenter over 4 labels."""
    import torch
    from transformers import SegformerConfig, SegformerForSemanticSegmentation, SegformerImageProcessor

    torch.manual_seed(2)
    config = SegformerConfig(
        **_labelled(
            num_encoder_blocks=2,
            depths=[1, 1],
            sr_ratios=[2, 1],
            hidden_sizes=[8, 16],
            patch_sizes=[7, 3],
            strides=[4, 2],
            num_attention_heads=[1, 2],
            mlp_ratios=[2, 2],
            decoder_hidden_size=16,
            initializer_range=0.5,
        )
    )
    processor = SegformerImageProcessor(size={"height": 32, "width": 32})
    return _save(SegformerForSemanticSegmentation(config), processor, folder)


def build_dpt(folder: Path) -> Path:
    """A 4-layer DPT depth estimator on a ViT backbone, 32x32 pixels."""
    import torch
    from transformers import DPTConfig, DPTForDepthEstimation, DPTImageProcessor

    torch.manual_seed(3)
    config = DPTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=64,
        backbone_out_indices=[0, 1, 2, 3],
        neck_hidden_sizes=[8, 16, 16, 32],
        fusion_hidden_size=16,
        head_in_index=-1,
        initializer_range=0.1,
    )
    network = DPTForDepthEstimation(config)
    # The head ends in a ReLU: a positive bias on its last convolution keeps the random map above zero
    # (an all-zero map would make the comparison with the pipeline empty).
    last = [m for m in network.head.modules() if isinstance(m, torch.nn.Conv2d)][-1]
    with torch.no_grad():
        last.bias.fill_(1.0)
    return _save(network, DPTImageProcessor(size={"height": 32, "width": 32}), folder)


def build_mask2former(folder: Path) -> Path:
    """A Mask2Former (universal segmentation: panoptic, instance, semantic) on a 4-stage Swin, 6 queries, 64x64."""
    import torch
    from transformers import (
        Mask2FormerConfig,
        Mask2FormerForUniversalSegmentation,
        Mask2FormerImageProcessor,
        SwinConfig,
    )

    torch.manual_seed(7)
    swin = SwinConfig(
        image_size=64,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1, 1, 1],
        num_heads=[1, 1, 2, 2],
        window_size=4,
        out_features=["stage1", "stage2", "stage3", "stage4"],
    )
    config = Mask2FormerConfig(
        **_labelled(
            backbone_config=swin,
            feature_size=32,
            mask_feature_size=32,
            hidden_dim=32,
            encoder_feedforward_dim=64,
            dim_feedforward=64,
            encoder_layers=1,
            decoder_layers=2,
            num_attention_heads=2,
            num_queries=6,
            common_stride=4,
        )
    )
    network = Mask2FormerForUniversalSegmentation(config)
    with torch.no_grad():  # real classes over "no object", so that panoptic and instance segments are found
        network.class_predictor.bias[-1] = -5.0
        network.class_predictor.weight.mul_(20.0)
    return _save(network, Mask2FormerImageProcessor(size={"height": 64, "width": 64}), folder)


def _whisper_vocabulary(folder: Path) -> dict[str, int]:
    """A byte-level tokenizer (256 byte tokens, no merges) with Whisper's special tokens; its vocabulary."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for token in _WHISPER_SPECIALS:
        vocab[token] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in _WHISPER_SPECIALS])
    tokenizer.save(str(folder / "tokenizer.json"))
    end = "<|endoftext|>"
    settings = {
        "tokenizer_class": "WhisperTokenizer",
        "bos_token": end,
        "eos_token": end,
        "pad_token": end,
        "additional_special_tokens": list(_WHISPER_SPECIALS[1:]),
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
    return vocab


def build_whisper(folder: Path) -> Path:
    """A random 2-layer Whisper (width 64) over a byte vocabulary, multilingual (en, fr, de), 80 mel bins."""
    import torch
    from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    folder.mkdir(parents=True, exist_ok=True)
    vocab = _whisper_vocabulary(folder)
    end, start = vocab["<|endoftext|>"], vocab["<|startoftranscript|>"]
    torch.manual_seed(4)
    # The same suppressed tokens in config.json and generation_config.json, as a real Whisper has them
    # (the pipeline passes config.json's to generate, which wins over the generation config's).
    suppress = [vocab["<|startoflm|>"], vocab["<|startofprev|>"], vocab["<|nocaptions|>"]]
    config = WhisperConfig(
        vocab_size=len(vocab),
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        num_mel_bins=80,
        max_source_positions=1500,
        max_target_positions=448,
        init_std=0.3,  # wide enough that greedy replies wander instead of repeating one token
        decoder_start_token_id=start,
        eos_token_id=end,
        pad_token_id=end,
        bos_token_id=end,
        suppress_tokens=suppress,
        begin_suppress_tokens=[end],
    )
    network = WhisperForConditionalGeneration(config)
    network.generation_config = GenerationConfig(
        decoder_start_token_id=start,
        eos_token_id=end,
        pad_token_id=end,
        bos_token_id=end,
        max_length=40,
        is_multilingual=True,
        lang_to_id={f"<|{code}|>": vocab[f"<|{code}|>"] for code in ("en", "fr", "de")},
        task_to_id={"transcribe": vocab["<|transcribe|>"], "translate": vocab["<|translate|>"]},
        no_timestamps_token_id=vocab["<|notimestamps|>"],
        suppress_tokens=suppress,
        begin_suppress_tokens=[end],
    )
    return _save(network, WhisperFeatureExtractor(feature_size=80), folder)


#: The LLaVA's chat template: ChatML, an ``<image>`` placeholder where each image block sits.
IMAGE_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for b in m['content'] %}{% if b['type'] == 'image' %}<image>{% else %}{{ b['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_llava(folder: Path) -> Path:
    """A LLaVA: a 2-layer CLIP vision tower on 32x32 pixels (16 image tokens), a 2-layer llama, its processor."""
    import torch
    from tiny_models import EOS_ID, write_char_tokenizer
    from tokenizers import AddedToken, Tokenizer
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    size = write_char_tokenizer(folder)
    tokenizer_file = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer_file.add_special_tokens([AddedToken("<image>", special=True, normalized=False)])
    tokenizer_file.save(str(folder / "tokenizer.json"))
    settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "chat_template": IMAGE_CHATML}))
    torch.manual_seed(6)
    vision = CLIPVisionConfig(
        image_size=32, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2
    )
    text = LlamaConfig(
        vocab_size=size + 1,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=size,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    network = LlavaForConditionalGeneration(config)
    with torch.no_grad():  # image embeddings loud enough that the picture changes the reply
        for parameter in network.model.multi_modal_projector.parameters():
            parameter.mul_(40.0)
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
        tokenizer=AutoTokenizer.from_pretrained(str(folder)),
        patch_size=8,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=IMAGE_CHATML,
        image_token="<image>",
    )
    _save(network, processor, folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS_ID, "pad_token_id": EOS_ID}))
    return folder


def tone(seconds: float, base: float, seed: int = 0) -> Any:
    """Seeded 16 kHz mono samples: a gliding tone with a harmonic and a little noise."""
    import numpy as np

    t = np.arange(int(seconds * 16000)) / 16000
    phase = 2 * np.pi * np.cumsum(base * (1 + 0.5 * t / seconds)) / 16000
    signal = 0.4 * np.sin(phase) + 0.2 * np.sin(2 * phase) + 0.05 * np.random.default_rng(seed).normal(size=t.size)
    return np.clip(signal, -1, 1).astype(np.float32)


def picture(width: int, height: int, seed: int) -> Any:
    """Seeded RGB pixels (a smooth gradient with noise), uint8 [height, width, 3]."""
    import numpy as np

    y, x = np.mgrid[0:height, 0:width]
    noise = np.random.default_rng(seed).integers(0, 60, size=(height, width, 3))
    base = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 256], axis=-1)
    return ((base * 0.7 + noise) % 256).astype(np.uint8)


MEDIA_BUILDERS: dict[str, Callable[[Path], Path]] = {
    "image-classification": build_vit,
    "object-detection": build_yolos,
    "image-segmentation": build_segformer,
    "depth-estimation": build_dpt,
    "automatic-speech-recognition": build_whisper,
    "image-text-to-text": build_llava,
    "universal-segmentation": build_mask2former,  # an image-segmentation model too, with panoptic/instance heads
}
