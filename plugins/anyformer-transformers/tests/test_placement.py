"""Where a model runs, from fake caps: the GPU torch can drive, the dtype per device, accelerate's split, the CPU.

No GPU is here: the choice is checked from caps and an ``Installed`` with a CUDA build, and loading
with accelerate's device map is checked with a CPU-only map (greedy text equal to the plain load's).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest
from anyformer_transformers import placement
from anyformer_transformers.estimate import RUNTIME_OVERHEAD, Plan
from anyformer_transformers.installed import installed
from anyformer_transformers.plugin import can_run
from test_can_run import CAPS, GiB, described

import anyformer
from anyformer import Refusal, Request

NVIDIA = CAPS.replace(gpu=True, gpu_name="NVIDIA H200", gpu_memory_source="nvml", gpu_bytes=80 * GiB)


@pytest.fixture
def cuda_torch(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The installed torch as if it were a CUDA build, with accelerate installed."""
    have = installed()
    assert have is not None
    fake = dataclasses.replace(have, gpu_runtime="cuda")
    monkeypatch.setattr("anyformer_transformers.plugin.installed", lambda: fake)
    monkeypatch.setattr(placement, "accelerate_installed", lambda: True)
    return fake


def test_a_cuda_gpu_with_room_takes_the_whole_model_in_bfloat16(cuda_torch: Any) -> None:
    verdict = can_run(described(), NVIDIA, Request())
    assert verdict.ok, verdict.reason
    estimate = verdict.estimate
    assert estimate is not None and estimate.details["device"] == "cuda" and estimate.details["dtype"] == "bfloat16"
    assert "offload" not in estimate.details
    # bf16 weights (the checkpoint's 2.47 GB), the KV cache and context on the device; the runtime on the host.
    assert 2.47e9 < estimate.gpu_bytes < 80 * GiB and estimate.ram_bytes == RUNTIME_OVERHEAD


def test_a_float16_checkpoint_stays_float16_on_cuda(cuda_torch: Any) -> None:
    config = {**described().config, "dtype": "float16"}
    verdict = can_run(described(config), NVIDIA, Request())
    assert verdict.estimate is not None and verdict.estimate.details["dtype"] == "float16"


def test_a_small_budget_splits_the_weights_with_accelerate_and_checks_host_memory(cuda_torch: Any) -> None:
    whole = can_run(described(), NVIDIA, Request())
    assert whole.estimate is not None
    budget = whole.estimate.gpu_bytes - 1 * GiB  # a GiB short of everything on the device
    verdict = can_run(described(), NVIDIA, Request(budget=budget))
    assert verdict.ok, verdict.reason
    estimate = verdict.estimate
    assert estimate is not None and estimate.gpu_bytes == budget and estimate.details["device"] == "cuda"
    assert "accelerate" in estimate.details["offload"]
    # The weights the budget leaves out are in host memory: about the GiB it was short.
    assert 1 * GiB <= estimate.ram_bytes - RUNTIME_OVERHEAD <= 1 * GiB + 2**20
    # The host-memory check: with too little RAM for the weights left out, no split; the CPU cannot hold it either.
    tight = NVIDIA.replace(ram_bytes=RUNTIME_OVERHEAD + GiB // 2)
    refused = can_run(described(), tight, Request(budget=budget))
    assert refused.code is Refusal.BUDGET and refused.need == whole.estimate.gpu_bytes, refused.reason


def test_a_split_needs_accelerate_else_the_cpu_runs_it(cuda_torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement, "accelerate_installed", lambda: False)
    verdict = can_run(described(), NVIDIA, Request(budget=2 * GiB))
    assert verdict.ok and verdict.estimate is not None
    assert verdict.estimate.details["device"] == "cpu" and verdict.estimate.gpu_bytes == 0
    assert "more than the" in verdict.estimate.details["gpu"]


def test_a_budget_too_small_for_a_useful_split_falls_back_to_the_cpu(cuda_torch: Any) -> None:
    verdict = can_run(described(), NVIDIA, Request(budget=GiB // 2))
    assert verdict.ok and verdict.estimate is not None and verdict.estimate.details["device"] == "cpu"


def test_a_cpu_build_of_torch_leaves_the_gpu_and_says_why() -> None:
    have = installed()
    assert have is not None and have.gpu_runtime is None  # this machine's torch is a CPU build
    verdict = can_run(described(), NVIDIA, Request())
    assert verdict.ok and verdict.estimate is not None
    assert verdict.estimate.details["device"] == "cpu" and "CPU build" in verdict.estimate.details["gpu"]


def test_metal_on_macos_is_mps_in_float16(cuda_torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    mac = CAPS.replace(gpu=True, gpu_name="Apple M3", gpu_memory_source="metal", gpu_bytes=24 * GiB)
    verdict = can_run(described(), mac, Request())
    assert verdict.estimate is not None
    assert verdict.estimate.details["device"] == "mps" and verdict.estimate.details["dtype"] == "float16"


def test_the_split_plan_gives_accelerate_its_max_memory() -> None:
    plan = Plan("bfloat16", ram_bytes=10 * GiB + RUNTIME_OVERHEAD, context=4096, weights=8 * GiB)
    gpu = placement.Gpu("cuda", budget=6 * GiB, can_split=True)
    chosen, _ = placement.place(lambda dtypes: [plan], "bfloat16", gpu, ram=64 * GiB)
    assert chosen is not None and chosen.max_memory is not None
    beside = 2 * GiB + placement.GPU_CONTEXT  # cache, activations and context
    assert chosen.max_memory[0] == 6 * GiB - beside
    assert chosen.load_options() == {"device_map": "auto", "max_memory": chosen.max_memory}
    whole = placement.Gpu("cuda", budget=None, can_split=True)
    assert placement.place(lambda dtypes: [plan], "bfloat16", whole, 64 * GiB)[0].load_options() == {  # type: ignore[union-attr]
        "device_map": "cuda"
    }


def test_loading_through_a_cpu_only_device_map_gives_the_same_text(
    tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """accelerate's device map (``device_map="auto"`` with ``max_memory``) on the CPU alone: the same greedy text."""
    pytest.importorskip("accelerate")
    messages = [{"role": "user", "content": "Hello there"}]
    with anyformer.load(tiny_llama_dir, backend="transformers", isolate=False) as model:
        plain = "".join(c.delta for c in model.generate(messages, max_new_tokens=12))
    real_place = placement.place

    def cpu_map(*args: Any) -> Any:
        chosen, candidates = real_place(*args)
        assert chosen is not None
        return dataclasses.replace(chosen, max_memory={"cpu": 8 * GiB}), candidates

    from transformers import AutoModelForCausalLM

    asked: list[dict[str, Any]] = []
    real_load = AutoModelForCausalLM.from_pretrained

    def recorded(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr("anyformer_transformers.plugin.place", cpu_map)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", recorded)
    with anyformer.load(tiny_llama_dir, backend="transformers", isolate=False) as model:
        assert asked and asked[0]["device_map"] == "auto" and asked[0]["max_memory"] == {"cpu": 8 * GiB}
        assert "accelerate" in model.handle.details["offload"]  # type: ignore[attr-defined]
        mapped = "".join(c.delta for c in model.generate(messages, max_new_tokens=12))
    assert mapped == plain and plain
