"""fp16 graphs decode torch's replies: the precision a CUDA provider is given first, checked wherever one runs.

The original found fp16 graphs decoding to word salad on one GPU, so the backend picks fp16 only
where the provider handles it (CUDA; the CPU takes fp32 or the integer graphs first, see
test_can_run). Here the tiny llama's fp32 export is converted to fp16 the way fp16 exports are made
(onnxruntime's ``float16`` converter: weights, activations, the KV cache and the logits in half
precision; ids int64), and that graph, the only one in its folder, must give torch's greedy replies
(recorded on the fp32 weights) through the KV loop and the public API, on the CPU here and on CUDA
where onnxruntime has it (the GPU machine's run; CI has no GPU, which the skip says).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnxruntime.transformers.float16 import convert_float_to_float16

import anyformer
from anyformer_onnx.chat.handle import OnnxChatModel
from anyformer_onnx.chat.sampling import Sampler
from anyformer_onnx.session.providers import CUDA, available_providers


@pytest.fixture(scope="module")
def tiny_llama_fp16_dir(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama folder with ``onnx/model_fp16.onnx`` (converted from its fp32 export) as its only graph."""
    folder = tmp_path_factory.mktemp("fp16") / "tiny-llama-fp16"
    shutil.copytree(tiny_llama_dir, folder)
    graph = onnx.load(str(folder / "onnx" / "model.onnx"))
    onnx.save(convert_float_to_float16(graph, keep_io_types=False), str(folder / "onnx" / "model_fp16.onnx"))
    (folder / "onnx" / "model.onnx").unlink()
    return folder


def _provider_or_skip(provider: str) -> None:
    if provider == "cuda" and CUDA not in available_providers():
        pytest.skip("onnxruntime has no CUDAExecutionProvider here (a GPU machine's run covers it)")


@pytest.mark.parametrize("provider", ["cpu", "cuda"])
def test_an_fp16_graph_gives_torchs_greedy_replies(tiny_llama_fp16_dir: Path, provider: str) -> None:
    _provider_or_skip(provider)
    reference: dict[str, Any] = json.loads((tiny_llama_fp16_dir / "reference.json").read_text())
    with anyformer.load(str(tiny_llama_fp16_dir), backend="onnx", options={"provider": provider}) as loaded:
        handle = loaded.handle
        assert isinstance(handle, OnnxChatModel)
        assert handle.details["precision"] == "fp16" and handle.details["file"] == "onnx/model_fp16.onnx"
        assert handle.details["provider"] == ("CUDAExecutionProvider" if provider == "cuda" else "CPUExecutionProvider")
        assert handle.loop.graph.kv_dtype is np.float16  # the cache stays in half precision, as exported
        for reply in reference["replies"]:
            ids = list(
                handle.loop.tokens(
                    reply["prompt_ids"],
                    Sampler(0.0, 0, 1.0, None),
                    limit=len(reply["reply_ids"]),
                    stop_ids=handle.text.eos_ids,
                )
            )
            assert ids == reply["reply_ids"], (
                f"fp16 greedy ids differ from torch's for {reply['messages'][-1]['content']!r}"
            )
            assert loaded.complete(reply["messages"], max_new_tokens=len(reply["reply_ids"])).text == reply["text"]
