"""LocalMind's engines on a split set opened by its first shard, on lavapipe: the logits equal the unsplit file's bit
for bit and llama.cpp's on the set (which loads a set from its first shard) within 1e-4.

F32 weights and an f32 KV cache on both sides: llama.cpp's F32 products then differ from the engine's only in
summation order (its quantised paths round activations first, which is not what is tested here).
"""

from __future__ import annotations

import numpy as np
import pytest

from anyformer.plugin import AnyformerError, Model, ModelFile, Refusal
from anyformer_gguf_gpu.engines import open_engine
from anyformer_gguf_gpu.gguf_file import GGUFFile
from anyformer_gguf_gpu.testing import RandomModel, write_random_gguf
from anyformer_gguf_gpu.testing_lfm2 import RandomLfm2, write_random_lfm2_gguf
from anyformer_gguf_gpu.testing_split import write_split_set
from anyformer_localmind.estimate import MAX_BATCH

PROMPT = [5, 77, 100, 3, 250, 9, 1, 40, 41, 42, 7]
CTX = 64
TOLERANCE = 1e-4
MODELS = {
    "llama": lambda path: write_random_gguf(path, RandomModel(quant="F32", n_layer=3), seed=21),
    "qwen3": lambda path: write_random_gguf(path, RandomModel(architecture="qwen3", quant="F32", n_layer=3), seed=22),
    "lfm2": lambda path: write_random_lfm2_gguf(path, RandomLfm2(quant="F32"), seed=23),
}


def _shard(name: str) -> int:
    """Embeddings in the first shard; each layer's attention or convolution in one shard, its FFN in the next."""
    if not name.startswith("blk."):
        return 0
    layer = int(name.split(".")[1])
    return (layer + (1 if ".ffn_" in name else 0)) % 3


@pytest.fixture(scope="module", params=list(MODELS))
def unsplit_and_first(request, tmp_path_factory) -> tuple[str, str]:
    folder = tmp_path_factory.mktemp(f"split-{request.param}")
    whole = str(folder / f"{request.param}.gguf")
    MODELS[request.param](whole)
    shards = write_split_set(whole, str(folder / f"{request.param}-F32"), 3, _shard)
    return whole, shards[0]


@pytest.fixture(scope="module")
def gpu():
    from anyformer_gguf_gpu.gpu import GPU

    try:
        return GPU(allow_software=True)
    except AnyformerError as exc:
        pytest.skip(f"no wgpu adapter: {exc}")


def _logits(gpu, path: str) -> np.ndarray:
    """What LocalMind's load does with the fetched file, then the logits of every prompt position."""
    with GGUFFile(path) as gguf:
        engine = open_engine(gpu, gguf, ctx=CTX, max_batch=MAX_BATCH, kv_f16=False)
    try:
        return engine.all_logits(PROMPT)
    finally:
        engine.release()


def _llama_cpp_logits(path: str) -> np.ndarray:
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(path, n_ctx=CTX, logits_all=True, type_k=0, type_v=0, verbose=False, seed=0)
    try:
        llm.eval(PROMPT)
        return np.array(llm.scores[: len(PROMPT)])
    finally:
        llm.close()


def test_split_logits_equal_the_unsplit_files_and_llama_cpps(gpu, unsplit_and_first):
    whole, first = unsplit_and_first
    split = _logits(gpu, first)
    assert np.array_equal(split, _logits(gpu, whole))
    theirs = _llama_cpp_logits(first)
    assert np.abs(split - theirs).max() <= TOLERANCE, np.abs(split - theirs).max()


def test_can_run_names_the_missing_shard():
    from anyformer import Caps, Request
    from anyformer_localmind.plugin import can_run

    files = (ModelFile("m-F32-00001-of-00003.gguf", size=10), ModelFile("m-F32-00003-of-00003.gguf", size=10))
    verdict = can_run(Model(repo="org/m", source="hub", files=files), Caps(), Request())
    assert verdict.code is Refusal.MODEL and "m-F32-00002-of-00003.gguf" in verdict.reason


def test_the_load_reads_the_set_from_its_first_shard(unsplit_and_first, monkeypatch):
    """LocalMindModel.open on the path the file choice hands over (the first shard): the weights uploaded from each
    shard give the unsplit file's greedy reply."""
    from pathlib import Path

    from anyformer import Request
    from anyformer_gguf_gpu.decode import greedy
    from anyformer_gguf_gpu.model_choice import load_caps
    from anyformer_localmind import engine as engine_module
    from anyformer_localmind.engine import LocalMindModel
    from anyformer_localmind.plugin import can_run

    def reply(path: str) -> list[int]:
        monkeypatch.setattr(
            engine_module, "fetch_chosen_gguf", lambda model, progress, backend, verdict: (path, Path(path))
        )
        model, request = Model(repo="local/m", source="local"), Request(context=CTX)
        verdict = can_run(model, load_caps(request, gpu=True), request)
        loaded = LocalMindModel.open(model, request, lambda e: None, verdict)
        try:
            assert loaded.engine is not None
            return list(greedy(loaded.engine, PROMPT, 8))
        finally:
            loaded.dispose()

    whole, first = unsplit_and_first
    ids = reply(first)
    assert len(ids) == 8 and ids == reply(whole)
