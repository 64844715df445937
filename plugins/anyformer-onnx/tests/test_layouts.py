"""The Hub's decoder layouts with external data: the same tiny llama, saved each way, greedy as torch."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import anyformer
from anyformer_onnx.chat.handle import OnnxChatModel
from anyformer_onnx.chat.sampling import Sampler

_TEXT_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json")


@pytest.mark.parametrize(
    ("graph", "data"),
    [
        ("onnx/model.onnx", "model.onnx_data"),  # transformers.js
        ("decoder_model_merged.onnx", "decoder_model_merged.onnx.data"),  # optimum, at the top
        ("onnx/model_q4.onnx", "model_q4.onnx_data"),  # a precision suffix (the name, not the content)
    ],
)
def test_external_data_layouts_load_and_decode_as_torch(
    graph: str, data: str, tmp_path: Path, tiny_llama_dir: Path, reference: Any
) -> None:
    import onnx

    target = tmp_path / graph
    target.parent.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(tiny_llama_dir / "onnx" / "model.onnx"))
    onnx.save_model(model, str(target), save_as_external_data=True, location=data, size_threshold=0)
    for name in _TEXT_FILES:
        shutil.copyfile(tiny_llama_dir / name, tmp_path / name)
    data_name = f"{graph.rsplit('/', 1)[0]}/{data}" if "/" in graph else data
    _, selection = anyformer.check(str(tmp_path), backend="onnx")
    chosen = selection.chosen
    assert chosen is not None and chosen.estimate is not None
    assert chosen.estimate.files == (graph, data_name)
    assert chosen.estimate.disk_bytes == (tmp_path / graph).stat().st_size + (tmp_path / data_name).stat().st_size
    with anyformer.load(str(tmp_path), backend="onnx") as loaded:
        handle = loaded.handle
        assert isinstance(handle, OnnxChatModel)
        assert handle.details["file"] == graph
        reply = reference(tiny_llama_dir)["replies"][0]
        ids = handle.loop.tokens(
            reply["prompt_ids"], Sampler(0.0, 0, 1.0, None), limit=len(reply["reply_ids"]), stop_ids=handle.text.eos_ids
        )
        assert list(ids) == reply["reply_ids"]


def test_a_graph_file_named_alone_finds_its_tokenizer_one_folder_up(tiny_llama_dir: Path, reference: Any) -> None:
    reply = reference(tiny_llama_dir)["replies"][0]
    with anyformer.load(str(tiny_llama_dir / "onnx" / "model.onnx"), backend="onnx") as loaded:
        assert loaded.model.files[0].name == "model.onnx"  # described as one file, nothing beside it
        last = loaded.complete(reply["messages"], max_new_tokens=len(reply["reply_ids"]))
    assert last.text == reply["text"]
