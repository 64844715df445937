"""The text side read from repo files: templates, end ids, generation defaults, limits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_onnx.text import setup as text_setup
from anyformer_onnx.text.setup import load_text_setup


def _folder(tmp_path: Path, tiny_llama_dir: Path, **files: object) -> dict[str, Path]:
    paths = {"tokenizer.json": tiny_llama_dir / "tokenizer.json"}
    for name, content in files.items():
        path = tmp_path / name.replace("__", ".")
        path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
        paths[path.name] = path
    return paths


def test_named_templates_pick_default_and_eos_ids_join(tmp_path: Path, tiny_llama_dir: Path) -> None:
    paths = _folder(
        tmp_path,
        tiny_llama_dir,
        tokenizer_config__json={
            "eos_token": {"content": "<|im_end|>"},
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
        },
        generation_config__json={"eos_token_id": [0], "repetition_penalty": 1.2, "top_k": 5, "top_p": 0.5},
    )
    setup = load_text_setup(paths, "m")
    assert setup.template == "D"
    assert setup.eos_ids == frozenset({0, 2})  # generation_config's, and the tokenizer's <|im_end|>
    assert (setup.repetition_penalty, setup.top_k, setup.top_p) == (1.2, 5, 0.5)


def test_chat_template_jinja_wins_over_tokenizer_config(tmp_path: Path, tiny_llama_dir: Path) -> None:
    paths = _folder(
        tmp_path,
        tiny_llama_dir,
        tokenizer_config__json={"chat_template": "from config"},
        chat_template__jinja="{{ messages[0]['content'] }}!",
    )
    setup = load_text_setup(paths, "m")
    assert setup.render([{"role": "user", "content": "hi"}]) == "hi!"


def test_no_tokenizer_is_bad_model(tmp_path: Path) -> None:
    with pytest.raises(AnyformerError) as caught:
        load_text_setup({}, "m")
    assert caught.value.code == ErrorCode.BAD_MODEL


def test_an_oversized_or_broken_tokenizer_is_bad_model(
    tmp_path: Path, tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(AnyformerError) as caught:
        load_text_setup({"tokenizer.json": broken}, "m")
    assert caught.value.code == ErrorCode.BAD_MODEL
    monkeypatch.setattr(text_setup, "MAX_TOKENIZER_BYTES", 100)
    with pytest.raises(AnyformerError) as caught:
        load_text_setup({"tokenizer.json": tiny_llama_dir / "tokenizer.json"}, "m")
    assert caught.value.code == ErrorCode.BAD_MODEL
