"""can_run on model descriptions alone: every refusal, the graph chosen, the estimate (no files needed)."""

from __future__ import annotations

from typing import Any

import pytest

from anyformer.plugin import Caps, Model, Rank, Refusal, Request, Verdict
from anyformer_onnx import plugin
from anyformer_onnx.graphs import choose_graph
from anyformer_onnx.session import providers as runtime
from anyformer_onnx.tasks.registry import task_of

CAPS = Caps(ram_bytes=16 * 10**9, store=True, cpu_count=2)
_CHAT_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
    "max_position_embeddings": 8192,
}


def _model(files: list[tuple[str, int]], **fields: Any) -> Model:
    data = {"repo": "org/m", "files": [{"name": n, "size": s} for n, s in files], **fields}
    config = data.pop("config", {})
    model = Model.from_dict(data)
    return Model(**{**model.__dict__, "config": config})


def _verdict(model: Model, caps: Caps = CAPS, **request: Any) -> Verdict:
    return plugin.can_run(model=model, caps=caps, request=Request.build(**request))


def _refusal(verdict: Verdict) -> Refusal | None:
    return None if verdict.ok else verdict.code


def test_no_onnx_file_is_format() -> None:
    verdict = _verdict(_model([("model.gguf", 10**6), ("tokenizer.json", 10)]))
    assert _refusal(verdict) == Refusal.FORMAT
    assert ".onnx" in verdict.reason


def test_text_diffusion_tag_is_model() -> None:
    verdict = _verdict(_model([("onnx/model.onnx", 10**6)], tags=["text-diffusion"]))
    assert _refusal(verdict) == Refusal.MODEL
    assert "text-diffusion" in verdict.reason


@pytest.mark.parametrize("task", ["zero-shot-image-classification", "summarization"])
def test_task_outside_the_set_is_task(task: str) -> None:
    verdict = _verdict(_model([("onnx/model.onnx", 10**6)]), task=task)
    assert _refusal(verdict) == Refusal.TASK
    assert task in verdict.reason


def test_a_head_this_version_does_not_run_is_task() -> None:
    model = _model([("onnx/model.onnx", 10**6)], config={"architectures": ["BertForMaskedLM"]}, task="fill-mask")
    verdict = _verdict(model)
    assert _refusal(verdict) == Refusal.TASK
    assert "fill-mask" in verdict.reason


def test_image_text_to_text_without_a_vision_encoder_is_model() -> None:
    model = _model([("onnx/model.onnx", 10**6)], config={"architectures": ["LlavaForConditionalGeneration"]})
    verdict = _verdict(model)
    assert _refusal(verdict) == Refusal.MODEL
    assert "vision_encoder" in verdict.reason


def test_an_image_classifier_is_accepted_with_its_preprocessor_config() -> None:
    files = [("onnx/model.onnx", 10**6), ("preprocessor_config.json", 10), ("config.json", 10)]
    model = _model(files, config={"architectures": ["ViTForImageClassification"]})
    verdict = _verdict(model)
    assert verdict.ok and verdict.estimate.details["task"] == "image-classification"
    bare = _model(files[:1], config={"architectures": ["ViTForImageClassification"]})
    verdict = _verdict(bare)
    assert _refusal(verdict) == Refusal.FORMAT
    assert "preprocessor_config.json" in verdict.reason


@pytest.mark.parametrize(("kind", "refusal"), [("detr", None), ("yolos", None), ("rt_detr", Refusal.MODEL)])
def test_object_detection_reads_detr_style_heads_only(kind: str, refusal: Refusal | None) -> None:
    files = [("onnx/model.onnx", 10**6), ("preprocessor_config.json", 10)]
    model = _model(files, config={"architectures": ["XForObjectDetection"], "model_type": kind})
    assert _refusal(_verdict(model)) == refusal


def test_no_graph_at_a_known_path_is_format() -> None:
    model = _model([("onnx/encoder_model.onnx", 10**6), ("onnx/vision.onnx", 10**6)], task="text-generation")
    verdict = _verdict(model)
    assert _refusal(verdict) == Refusal.FORMAT
    assert "known path" in verdict.reason


_MODULES = [
    ("onnx/embed_tokens.onnx", 10**6),
    ("onnx/vision_encoder.onnx", 2 * 10**6),
    ("onnx/decoder_model_merged.onnx", 3 * 10**6),
    ("onnx/decoder_model_merged_q4.onnx", 10**6),
    ("preprocessor_config.json", 10),
]
_LLAVA = {
    "architectures": ["LlavaForConditionalGeneration"],
    "text_config": {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64},
}


def test_per_module_graphs_are_image_chat() -> None:
    verdict = _verdict(_model(_MODULES, config=_LLAVA))
    assert verdict.ok, verdict.reason
    assert verdict.estimate.details["task"] == "image-text-to-text"
    # q4 lacks its embed_tokens and vision_encoder: the fp32 set is read, the KV cache from text_config.
    assert set(verdict.estimate.files) == {name for name, _ in _MODULES[:3]}
    assert verdict.estimate.details["precision"] == "fp32"
    assert _verdict(_model(_MODULES, config=_LLAVA, task="text-generation")).ok


@pytest.mark.parametrize(
    ("files", "task", "refusal", "words"),
    [
        (_MODULES[1:], None, Refusal.MODEL, "embed_tokens"),
        (_MODULES[:4], None, Refusal.FORMAT, "preprocessor_config.json"),
        (_MODULES, "feature-extraction", Refusal.MODEL, "chat only"),
        ([("onnx/speech_encoder.onnx", 10), _MODULES[0], *_MODULES[2:]], None, Refusal.MODEL, "speech_encoder"),
        ([("onnx/audio_encoder.onnx", 10), *_MODULES[2:]], None, Refusal.MODEL, "embed_tokens"),
    ],
)
def test_per_module_graphs_missing_a_part_are_refused(
    files: list[tuple[str, int]], task: str | None, refusal: Refusal, words: str
) -> None:
    verdict = _verdict(_model(files, config=_LLAVA), **({"task": task} if task else {}))
    assert _refusal(verdict) == refusal
    assert words in verdict.reason


_AUDIO_MODULES = [
    ("onnx/embed_tokens.onnx", 10**6),
    ("onnx/audio_encoder.onnx", 2 * 10**6),
    ("onnx/decoder_model_merged.onnx", 3 * 10**6),
    ("onnx/embed_tokens_q4.onnx", 10**6),
    ("onnx/decoder_model_merged_q4.onnx", 10**6),
    ("processor_config.json", 10),
]
_QWEN2_AUDIO = {
    "architectures": ["Qwen2AudioForConditionalGeneration"],
    "text_config": {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64},
}


def test_per_module_graphs_with_an_audio_encoder_are_audio_chat() -> None:
    verdict = _verdict(_model(_AUDIO_MODULES, config=_QWEN2_AUDIO))
    assert verdict.ok, verdict.reason
    assert verdict.estimate.details["task"] == "audio-text-to-text"
    assert verdict.estimate.details["inputs"] == ["text", "audio"]
    # q4 lacks its audio_encoder: the fp32 set is read, every encoder the repo has in it.
    assert set(verdict.estimate.files) == {name for name, _ in _AUDIO_MODULES[:3]}
    assert verdict.estimate.details["precision"] == "fp32"
    # A repo with no graphs yet still reads as audio chat from its architecture.
    assert task_of(_model([("onnx/model.onnx", 10)], config=_QWEN2_AUDIO), None) == "audio-text-to-text"


def test_a_repo_with_both_encoders_reads_both() -> None:
    files = [*_MODULES[:3], _AUDIO_MODULES[1], ("preprocessor_config.json", 10)]
    verdict = _verdict(_model(files, config=_LLAVA))
    assert verdict.ok, verdict.reason
    assert verdict.estimate.details["task"] == "image-text-to-text"
    assert verdict.estimate.details["inputs"] == ["text", "image", "audio"]
    assert set(verdict.estimate.files) == {name for name, _ in files[:4]}
    assert _verdict(_model(files, config=_LLAVA), task="audio-text-to-text").ok


def test_inputs_of_text_and_image_chat() -> None:
    assert _verdict(_model(_MODULES, config=_LLAVA)).estimate.details["inputs"] == ["text", "image"]
    text = _verdict(_model([("onnx/model.onnx", 10**6), ("tokenizer.json", 10)], config=_CHAT_CONFIG))
    assert text.estimate.details["inputs"] == ["text"]


@pytest.mark.parametrize(
    ("files", "task", "refusal", "words"),
    [
        (_AUDIO_MODULES[:5], None, Refusal.FORMAT, "feature extractor"),
        (_AUDIO_MODULES, "image-text-to-text", Refusal.MODEL, "vision_encoder"),
        (_MODULES, "audio-text-to-text", Refusal.MODEL, "audio_encoder"),
        ([("onnx/model.onnx", 10**6)], "audio-text-to-text", Refusal.MODEL, "audio_encoder"),
    ],
)
def test_audio_chat_refusals(files: list[tuple[str, int]], task: str | None, refusal: Refusal, words: str) -> None:
    verdict = _verdict(_model(files, config=_QWEN2_AUDIO), **({"task": task} if task else {}))
    assert _refusal(verdict) == refusal
    assert words in verdict.reason


def test_memory_counts_graph_external_data_and_kv_cache() -> None:
    files = [("onnx/model.onnx", 10**6), ("onnx/model.onnx_data", 3 * 10**9), ("tokenizer.json", 10)]
    model = _model(files, config=_CHAT_CONFIG)
    verdict = _verdict(model, CAPS.replace(ram_bytes=2 * 10**9))
    assert _refusal(verdict) == Refusal.MEMORY
    assert verdict.need is not None and verdict.need > 3 * 10**9
    accepted = _verdict(model, CAPS.replace(ram_bytes=verdict.need))
    assert accepted.ok
    assert accepted.estimate is not None
    kv = 2 * 30 * 3 * 64 * 4096 * 4  # layers × kv heads × head size × default context × fp32, keys and values
    assert accepted.estimate.ram_bytes == verdict.need
    assert accepted.estimate.ram_bytes >= 3 * 10**9 + 10**6 + kv
    assert accepted.estimate.disk_bytes == 3 * 10**9 + 10**6
    assert accepted.estimate.files == ("onnx/model.onnx", "onnx/model.onnx_data")


def test_budget_when_the_provider_is_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "expected_provider", lambda gpu: runtime.CUDA if gpu else runtime.CPU)
    model = _model([("onnx/model_fp16.onnx", 10**6), ("onnx/model_fp16.onnx_data", 10**9)], config=_CHAT_CONFIG)
    caps = CAPS.replace(gpu=True, gpu_bytes=80 * 10**9)
    verdict = _verdict(model, caps, budget=10**8)
    assert _refusal(verdict) == Refusal.BUDGET
    assert verdict.need is not None and verdict.need > 10**9
    accepted = _verdict(model, caps, budget=verdict.need)
    assert accepted.ok and accepted.estimate is not None
    assert accepted.estimate.gpu_bytes == verdict.need
    assert accepted.estimate.details["provider"] == runtime.CUDA


def test_runtime_when_onnxruntime_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "onnxruntime_installed", lambda: False)
    verdict = _verdict(_model([("onnx/model.onnx", 10**6)]))
    assert _refusal(verdict) == Refusal.RUNTIME
    assert "pip install onnxruntime" in verdict.reason


def test_accepts_a_chat_export_with_rank_general_and_the_provider_in_details() -> None:
    model = _model([("onnx/model.onnx", 10**6), ("tokenizer.json", 10)], config=_CHAT_CONFIG)
    verdict = _verdict(model)
    assert verdict.ok and verdict.estimate is not None
    assert verdict.estimate.rank == Rank.GENERAL
    assert verdict.estimate.details["provider"] == runtime.CPU
    assert verdict.estimate.details["task"] == "text-generation"
    assert verdict.estimate.gpu_bytes == 0


def test_sentence_transformers_repo_is_feature_extraction() -> None:
    model = _model([("onnx/model.onnx", 10**6), ("modules.json", 10)], config={"architectures": ["BertModel"]})
    verdict = _verdict(model)
    assert verdict.ok and verdict.estimate is not None
    assert verdict.estimate.details["task"] == "feature-extraction"


_LAYOUT = [
    ("onnx/model.onnx", 600),
    ("onnx/model_fp16.onnx", 300),
    ("onnx/model_q4.onnx", 100),
    ("onnx/model_q4f16.onnx", 90),
    ("onnx/model_quantized.onnx", 150),
]


@pytest.mark.parametrize(
    ("device", "wanted", "expected"),
    [
        ("cpu", None, "onnx/model_q4.onnx"),
        ("cuda", None, "onnx/model_fp16.onnx"),
        ("cpu", "fp32", "onnx/model.onnx"),
        ("cpu", "int8", "onnx/model_quantized.onnx"),
        ("cpu", "q4f16", "onnx/model_q4f16.onnx"),
        ("cpu", "bnb4", None),
    ],
)
def test_graph_choice_by_provider_and_precision(device: str, wanted: str | None, expected: str | None) -> None:
    choice = choose_graph(_model(_LAYOUT), ("model",), device, wanted)
    assert (choice.graph.name if choice else None) == expected


@pytest.mark.parametrize("data", ["model.onnx_data", "model.onnx.data", "model.onnx_data_1", "model.onnx.data_2"])
def test_external_data_names(data: str) -> None:
    model = _model([("model.onnx", 10), (data, 1000), ("model.onnx_other", 7)])
    choice = choose_graph(model, ("model",), "cpu")
    assert choice is not None
    assert choice.files == ("model.onnx", data)
    assert choice.size == 1010


def test_optimum_merged_decoder_at_the_top() -> None:
    model = _model([("decoder_model_merged.onnx", 10), ("decoder_model_merged.onnx_data", 100)], task="text-generation")
    verdict = _verdict(model)
    assert verdict.ok and verdict.estimate is not None
    assert verdict.estimate.files == ("decoder_model_merged.onnx", "decoder_model_merged.onnx_data")


def test_a_precision_the_repo_lacks_is_format_naming_it() -> None:
    verdict = _verdict(_model(_LAYOUT), options={"precision": "bnb4"})
    assert _refusal(verdict) == Refusal.FORMAT
    assert "bnb4" in verdict.reason
    chosen = _verdict(_model(_LAYOUT), options={"precision": "fp16"})
    assert chosen.ok and chosen.estimate is not None
    assert chosen.estimate.files == ("onnx/model_fp16.onnx",)


_WHISPER_FILES = [
    ("onnx/encoder_model.onnx", 10**6),
    ("onnx/decoder_model.onnx", 2 * 10**6),
    ("onnx/decoder_with_past_model.onnx", 2 * 10**6),
    ("onnx/decoder_model_merged.onnx", 2 * 10**6),
    ("onnx/encoder_model_q4.onnx", 10**5),
    ("onnx/decoder_model_q4.onnx", 10**5),
    ("preprocessor_config.json", 10),
    ("tokenizer.json", 10),
    ("generation_config.json", 10),
]
_WHISPER_CONFIG = {"architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper"}


def test_a_whisper_export_is_speech_recognition_with_all_three_graphs() -> None:
    verdict = _verdict(_model(_WHISPER_FILES, config=_WHISPER_CONFIG))
    assert verdict.ok, verdict.reason
    assert verdict.estimate.details["task"] == "automatic-speech-recognition"
    # q4 lacks its decoder_with_past graph: the fp32 set, all three parts, is read and counted.
    assert verdict.estimate.details["precision"] == "fp32"
    assert set(verdict.estimate.files) == {name for name, _ in _WHISPER_FILES[:3]}
    assert verdict.estimate.disk_bytes == 5 * 10**6


@pytest.mark.parametrize(
    ("drop", "refusal", "words"),
    [
        ("onnx/decoder_with_past_model.onnx", Refusal.FORMAT, "decoder_with_past_model"),
        ("preprocessor_config.json", Refusal.FORMAT, "preprocessor_config.json"),
        ("generation_config.json", Refusal.FORMAT, "generation_config.json"),
    ],
)
def test_a_whisper_export_missing_a_part_is_refused(drop: str, refusal: Refusal, words: str) -> None:
    files = [entry for entry in _WHISPER_FILES if entry[0] != drop]
    verdict = _verdict(_model(files, config=_WHISPER_CONFIG))
    assert _refusal(verdict) == refusal
    assert words in verdict.reason


def test_a_ctc_speech_model_is_model() -> None:
    config = {"architectures": ["Wav2Vec2ForCTC"], "model_type": "wav2vec2"}
    verdict = _verdict(_model([("onnx/model.onnx", 10**6), ("preprocessor_config.json", 10)], config=config))
    assert _refusal(verdict) == Refusal.MODEL
    assert "Whisper" in verdict.reason


@pytest.mark.parametrize(
    ("architecture", "refusal"),
    [
        ("SegformerForSemanticSegmentation", None),
        ("Mask2FormerForUniversalSegmentation", None),
        ("MaskFormerForInstanceSegmentation", Refusal.MODEL),
        ("OneFormerForUniversalSegmentation", Refusal.MODEL),
        ("DetrForSegmentation", Refusal.MODEL),
    ],
)
def test_image_segmentation_reads_semantic_heads_and_mask2former(architecture: str, refusal: Refusal | None) -> None:
    files = [("onnx/model.onnx", 10**6), ("preprocessor_config.json", 10)]
    model = _model(files, config={"architectures": [architecture]})
    verdict = _verdict(model, task="image-segmentation")
    assert _refusal(verdict) == refusal
    if refusal is not None:
        assert architecture in verdict.reason  # the refusal names the head it does not read


def test_universal_segmentation_heads_mean_image_segmentation() -> None:
    files = [("onnx/model.onnx", 10**6), ("preprocessor_config.json", 10)]
    model = _model(files, config={"architectures": ["Mask2FormerForUniversalSegmentation"]})
    assert _verdict(model).estimate.details["task"] == "image-segmentation"


#: A Qwen2-VL config.json as transformers 5 writes it: M-RoPE sections under text_config.
_QWEN2_VL = {
    "architectures": ["Qwen2VLForConditionalGeneration"],
    "image_token_id": 7,
    "vision_start_token_id": 5,
    "vision_end_token_id": 6,
    "text_config": {
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_size": 64,
        "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3]},
    },
}


def test_qwen2_vl_modules_are_image_chat() -> None:
    verdict = _verdict(_model(_MODULES, config=_QWEN2_VL))
    assert verdict.ok, verdict.reason
    assert verdict.estimate.details["task"] == "image-text-to-text"
    assert verdict.estimate.details["inputs"] == ["text", "image"]


@pytest.mark.parametrize(
    "config",
    [
        _QWEN2_VL,
        # Older configs keep the sections in a flat rope_scaling; Qwen2.5-Omni nests them in its thinker.
        {"architectures": ["X"], "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}},
        {"thinker_config": {"text_config": {"rope_scaling": {"mrope_section": [16, 24, 24]}}}},
    ],
)
def test_audio_with_m_rope_is_model(config: dict[str, Any]) -> None:
    files = [*_AUDIO_MODULES[:3], ("preprocessor_config.json", 10)]
    verdict = _verdict(_model(files, config=config))
    assert _refusal(verdict) == Refusal.MODEL
    assert "M-RoPE" in verdict.reason
    # The same repo without the M-RoPE sections is audio chat.
    assert _verdict(_model(files, config=_QWEN2_AUDIO)).ok
