"""The verdict names the files a load reads, so ``anyformer pull`` fetches exactly those."""

from __future__ import annotations

from anyformer import Caps, Model, Request
from anyformer_llamacpp import plugin


def _model(files: list[tuple[str, int]]) -> Model:
    return Model.from_dict({"repo": "org/x", "files": [{"name": n, "size": s} for n, s in files]})


def _caps() -> Caps:
    return Caps(ram_bytes=16 * 10**9, cpu_count=2, store=True)


def test_the_estimate_names_the_chosen_quant_only() -> None:
    model = _model([("x-Q8_0.gguf", 300), ("x-Q4_K_M.gguf", 200), ("README.md", 5)])
    verdict = plugin.can_run(model, _caps(), Request())
    assert verdict.ok and verdict.estimate is not None
    assert verdict.estimate.files == ("x-Q4_K_M.gguf",)
    assert verdict.to_dict()["estimate"]["files"] == ["x-Q4_K_M.gguf"]


def test_the_estimate_names_every_shard_of_a_split_set_in_order() -> None:
    shards = [(f"big-Q4_0-{i:05d}-of-00003.gguf", 100) for i in (3, 1, 2)]
    verdict = plugin.can_run(_model([*shards, ("small-Q8_0.gguf", 10)]), _caps(), Request())
    assert verdict.ok and verdict.estimate is not None
    assert verdict.estimate.files == tuple(f"big-Q4_0-{i:05d}-of-00003.gguf" for i in (1, 2, 3))
