"""``can_run`` from descriptions alone: what it accepts, each refusal and its one line, and the memory sums."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "anyformer-core" / "tests"))

from anyformer_transformers.estimate import DTYPE_BYTES, ENCODER_BATCH, RUNTIME_OVERHEAD, Shape, encoder_plans, plans
from anyformer_transformers.plugin import can_run
from hub_fixtures import point_huggingface_hub_at
from hub_server import FakeHub

import anyformer
from anyformer import Caps, Model, Rank, Refusal, Request

GiB = 2**30
LLAMA_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "max_position_embeddings": 131072,
    "dtype": "bfloat16",
}
#: meta-llama/Llama-3.2-1B's root files (sizes as its listing gives them).
LLAMA_FILES = [
    {"name": "config.json", "size": 843},
    {"name": "generation_config.json", "size": 185},
    {"name": "model.safetensors", "size": 2_471_645_608},
    {"name": "special_tokens_map.json", "size": 301},
    {"name": "tokenizer.json", "size": 9_085_657},
    {"name": "tokenizer_config.json", "size": 50_500},
    {"name": "original/consolidated.00.pth", "size": 2_471_677_246},
]
CAPS = Caps(ram_bytes=32 * GiB, store=True, cpu_count=4)


def described(config: dict[str, Any] | None = None, files: list[dict[str, Any]] | None = None, **fields: Any) -> Model:
    data = {"repo": "org/model", "source": "hub", "files": files if files is not None else LLAMA_FILES, **fields}
    model = Model.from_dict(data)
    return dataclasses.replace(model, config=LLAMA_CONFIG if config is None else config)


def test_a_safetensors_llama_is_accepted_as_the_fallback_with_its_files_named() -> None:
    verdict = can_run(described(), CAPS, Request())
    assert verdict.ok, verdict.reason
    estimate = verdict.estimate
    assert estimate is not None and estimate.rank is Rank.FALLBACK
    assert estimate.details["dtype"] == "float32" and estimate.details["class"] == "LlamaForCausalLM"
    assert "model.safetensors" in estimate.files and "tokenizer.json" in estimate.files
    assert not any(name.startswith("original/") for name in estimate.files)  # the .pth is never fetched


def test_memory_counts_weights_in_the_dtype_held_plus_the_kv_cache() -> None:
    shape = Shape.of(LLAMA_CONFIG)
    assert shape is not None
    float32, stored = plans(LLAMA_CONFIG, 2_471_645_608, shape, 1024)
    parameters = 2_471_645_608 // 2
    kv32 = 2 * 16 * 8 * 64 * 1024 * 4
    assert float32.dtype == "float32" and float32.ram_bytes > parameters * 4 + kv32 + RUNTIME_OVERHEAD
    assert stored.dtype == "bfloat16" and stored.ram_bytes < float32.ram_bytes
    assert stored.ram_bytes > parameters * DTYPE_BYTES["bfloat16"]


def test_it_falls_back_to_the_stored_dtype_when_float32_does_not_fit() -> None:
    verdict = can_run(described(), CAPS.replace(ram_bytes=4 * GiB), Request(context=1024))
    assert verdict.ok, verdict.reason
    assert verdict.estimate is not None and verdict.estimate.details["dtype"] == "bfloat16"


def test_too_little_memory_is_a_memory_refusal_whose_need_is_accepted() -> None:
    verdict = can_run(described(), CAPS.replace(ram_bytes=2 * GiB), Request(context=1024))
    assert verdict.code is Refusal.MEMORY and verdict.need is not None and verdict.need > 2 * GiB
    assert can_run(described(), CAPS.replace(ram_bytes=verdict.need), Request(context=1024)).ok


@pytest.mark.parametrize(
    ("config", "files", "code", "words"),
    [
        (
            {**LLAMA_CONFIG, "auto_map": {"AutoModelForCausalLM": "modeling.M"}},
            None,
            Refusal.MODEL,
            "trust_remote_code",
        ),
        (
            {**LLAMA_CONFIG, "quantization_config": {"quant_method": "bitsandbytes"}},
            None,
            Refusal.MODEL,
            "bitsandbytes",
        ),
        ({**LLAMA_CONFIG, "model_type": "not-a-model-type"}, None, Refusal.MODEL, "no text-generation class"),
        ({k: v for k, v in LLAMA_CONFIG.items() if k != "num_hidden_layers"}, None, Refusal.MODEL, "layer"),
        (None, [f for f in LLAMA_FILES if f["name"] != "tokenizer.json"], Refusal.MODEL, "tokenizer.json"),
        (None, [f for f in LLAMA_FILES if f["name"] != "config.json"], Refusal.FORMAT, "config.json"),
        (None, [{"name": "model.gguf", "size": 10}], Refusal.FORMAT, "safetensors"),
        (
            None,
            [{"name": "onnx/model.safetensors", "size": 10}, {"name": "config.json", "size": 2}],
            Refusal.FORMAT,
            "",
        ),
    ],
)
def test_each_refusal_says_why_in_one_line(
    config: dict[str, Any] | None, files: list[dict[str, Any]] | None, code: Refusal, words: str
) -> None:
    verdict = can_run(described(config, files), CAPS, Request())
    assert verdict.code is code, verdict.reason
    assert words in verdict.reason and "\n" not in verdict.reason


def test_a_task_it_does_not_run_is_a_task_refusal_after_the_format() -> None:
    assert can_run(described(), CAPS, Request(task="text-to-speech")).code is Refusal.TASK
    # A task it runs, asked of a model whose type transformers builds no head for: a model refusal.
    verdict = can_run(described(), CAPS, Request(task="image-classification"))
    assert verdict.code is Refusal.MODEL and "no image-classification class for model_type 'llama'" in verdict.reason
    assert can_run(described(files=[{"name": "m.onnx", "size": 1}]), CAPS, Request(task="x")).code is Refusal.FORMAT


def test_a_hub_model_needs_a_writable_store() -> None:
    # The core's store check, from the files the estimate names (the backend has no copy of it).
    from anyformer_transformers import plugin

    manager = anyformer.PluginManager()
    manager.register(plugin, "transformers")
    (verdict,) = manager.can_run(described(), CAPS.replace(store=False), Request())
    assert verdict.code is Refusal.STORE and "must be downloaded" in verdict.reason


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub() as server:
        point_huggingface_hub_at(monkeypatch, server.url, tmp_path / "hf")
        monkeypatch.setenv("ANYFORMER_HOME", str(tmp_path / "home"))
        yield server


def test_check_on_a_safetensors_only_hub_repo_chooses_transformers_and_explains_the_others(
    hub: FakeHub, tiny_llama_dir: Path
) -> None:
    files = {p.name: p for p in tiny_llama_dir.iterdir() if p.is_file()}
    hub.add_repo("org/tiny-llama", files, pipeline_tag="text-generation")
    _, selection = anyformer.check("org/tiny-llama", caps=CAPS)
    assert selection.chosen_backend == "transformers", selection
    others = [v for v in selection.verdicts if v.backend != "transformers"]
    assert others and all(not v.ok and v.reason for v in others)


def test_run_on_that_hub_repo_streams_transformers_own_greedy_text(hub: FakeHub, tiny_llama_dir: Path) -> None:
    from tiny_models import reference_reply

    files = {p.name: p for p in tiny_llama_dir.iterdir() if p.is_file()}
    hub.add_repo("org/tiny-llama", files, pipeline_tag="text-generation")
    messages = [{"role": "user", "content": "Hello there"}]
    with anyformer.load("org/tiny-llama", backend="transformers") as model:
        text = list(model.generate(messages, max_new_tokens=16))[-1].text
    assert text == reference_reply(tiny_llama_dir, messages, 16)
    assert json.loads((tiny_llama_dir / "config.json").read_text())["model_type"] == "llama"


# ---- the encoder tasks ----------------------------------------------------------------------------

BERT_CONFIG: dict[str, Any] = {
    "model_type": "bert",
    "architectures": ["BertForSequenceClassification"],
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "max_position_embeddings": 512,
    "id2label": {"0": "NEGATIVE", "1": "POSITIVE"},
}
BERT_FILES = [
    {"name": "config.json", "size": 700},
    {"name": "model.safetensors", "size": 438_000_000},
    {"name": "tokenizer.json", "size": 466_000},
    {"name": "tokenizer_config.json", "size": 300},
]


@pytest.mark.parametrize(
    ("architecture", "task", "expected_class"),
    [
        ("BertForSequenceClassification", "text-classification", "BertForSequenceClassification"),
        ("BertForTokenClassification", "token-classification", "BertForTokenClassification"),
        ("BertModel", "feature-extraction", "BertModel"),
    ],
)
def test_an_encoder_is_accepted_for_the_task_its_architecture_names(
    architecture: str, task: str, expected_class: str
) -> None:
    model = described({**BERT_CONFIG, "architectures": [architecture]}, BERT_FILES)
    verdict = can_run(model, CAPS, Request())
    assert verdict.ok, verdict.reason
    assert verdict.estimate is not None and verdict.estimate.details["class"] == expected_class
    assert verdict.estimate.details["max_tokens"] == 512 and "context" not in verdict.estimate.details


def test_a_sentence_transformers_repo_is_feature_extraction_and_its_pooling_is_fetched() -> None:
    files = [*BERT_FILES, {"name": "modules.json", "size": 300}, {"name": "1_Pooling/config.json", "size": 200}]
    verdict = can_run(described({**BERT_CONFIG, "architectures": ["BertModel"]}, files), CAPS, Request())
    assert verdict.ok and verdict.estimate is not None, verdict.reason
    assert verdict.estimate.details["class"] == "BertModel"
    assert "1_Pooling/config.json" in verdict.estimate.files
    similarity = can_run(described(BERT_CONFIG, files), CAPS, Request(task="sentence-similarity"))
    assert similarity.ok and similarity.estimate is not None and similarity.estimate.details["class"] == "BertModel"


def test_the_task_asked_for_picks_its_auto_table() -> None:
    model = described({**BERT_CONFIG, "model_type": "not-a-model-type"}, BERT_FILES)
    verdict = can_run(model, CAPS, Request(task="token-classification"))
    assert verdict.code is Refusal.MODEL and "no token-classification class" in verdict.reason
    # A causal LM's body embeds (LlamaModel) and its classification head is a class of its own.
    assert can_run(described(), CAPS, Request(task="feature-extraction")).estimate.details["class"] == "LlamaModel"  # type: ignore[union-attr]
    head = can_run(described(), CAPS, Request(task="text-classification")).estimate
    assert head is not None and head.details["class"] == "LlamaForSequenceClassification"


def test_an_encoder_holds_no_kv_cache_so_the_context_asked_changes_nothing() -> None:
    def ram(task: str, context: int) -> int:
        verdict = can_run(described(), CAPS, Request(task=task, context=context))
        assert verdict.estimate is not None, verdict.reason
        return verdict.estimate.ram_bytes

    assert ram("feature-extraction", 1024) == ram("feature-extraction", 4096)
    assert ram("text-generation", 1024) < ram("text-generation", 4096)
    shape = Shape.of(BERT_CONFIG)
    assert shape is not None
    (float32,) = encoder_plans(BERT_CONFIG, 438_000_000, shape)
    assert float32.ram_bytes > 438_000_000 + ENCODER_BATCH * 12 * 512 * 512 * 4  # weights and one batch's scores


def test_too_little_memory_for_an_encoder_is_a_memory_refusal_whose_need_is_accepted() -> None:
    model = described(BERT_CONFIG, BERT_FILES)
    verdict = can_run(model, CAPS.replace(ram_bytes=2**29), Request())
    assert verdict.code is Refusal.MEMORY and "batch" in verdict.reason and verdict.need is not None
    assert can_run(model, CAPS.replace(ram_bytes=verdict.need), Request()).ok


def test_a_sentence_transformers_hub_repo_is_chosen_and_embeds_as_the_reference(
    hub: FakeHub, tiny_encoder_dir: dict[str, Path]
) -> None:
    import numpy as np
    from tiny_encoders import reference_embedding

    folder = tiny_encoder_dir["embedder"]
    files = {str(p.relative_to(folder)): p for p in folder.rglob("*") if p.is_file()}
    hub.add_repo("org/tiny-embedder", files, pipeline_tag="sentence-similarity", tags=["sentence-transformers"])
    _, selection = anyformer.check("org/tiny-embedder", caps=CAPS)
    assert selection.chosen_backend == "transformers", selection
    text = "A man is eating food."
    with anyformer.load("org/tiny-embedder", backend="transformers") as model:
        assert model.task == "sentence-similarity"
        vector = np.asarray(model.run(text)["embeddings"][0])
    assert np.abs(vector - reference_embedding(folder, text)).max() < 1e-5
