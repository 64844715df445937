"""arch/registry.py is the one list of MoE families: can_run, the config reader, the plan and the load ask it alone."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from diskformer_reference import greedy_steps, open_or_skip

import anyformer
from anyformer import Caps, Refusal, Request
from anyformer.plugin import read_gguf_header
from anyformer_diskformer import plugin
from anyformer_diskformer.arch import qwen3moe, registry
from anyformer_diskformer.arch.registry import ARCHITECTURES, moe_problem
from anyformer_diskformer.engine_choice import cpu_engine_class
from anyformer_diskformer.plan import plan_from_header

CAPS = Caps(ram_bytes=64 * 2**30, store=True)
#: A family no module declares, named as long as qwen3moe so the renamed header keeps its offsets.
NEW = "testmoe1"


def renamed(path: str, folder: Path) -> str:
    """A copy of the qwen3moe GGUF at ``path`` whose architecture (``general.architecture`` and every
    ``qwen3moe.*`` key) is :data:`NEW`: the same tensors under a family the registry does not list."""
    data = Path(path).read_bytes()
    old = qwen3moe.SPEC.name.encode()
    assert len(old) == len(NEW)  # same length: every offset in the file stays where it was
    copy = folder / "tiny-testmoe1-f32.gguf"
    copy.write_bytes(data.replace(old, NEW.encode()))
    assert read_gguf_header(str(copy)).architecture == NEW
    return str(copy)


def test_can_run_reads_exactly_the_registry_s_families():
    """Every listed family passes the architecture check, the refusal names the registry's list, and a family
    taken out of the registry is refused: no other list of architectures decides."""
    summary = {"tensor_types": ["F32"]}
    for name in ARCHITECTURES:
        assert moe_problem({**summary, "architecture": name}) is None, name
    refused = moe_problem({**summary, "architecture": "llama"})
    assert refused is not None and refused.endswith(f"({', '.join(ARCHITECTURES)})")
    assert set(ARCHITECTURES) == {"qwen3moe", "qwen2moe", "bailingmoe", "bailingmoe2", "qwen35moe", "gemma4"}


def test_a_family_left_out_of_the_registry_is_refused_by_can_run(moe_f32, monkeypatch):
    monkeypatch.delitem(registry.ARCHITECTURES, "qwen3moe")
    v = plugin.can_run(anyformer.describe(moe_f32), CAPS, Request())
    assert not v.ok and v.code is Refusal.MODEL and "'qwen3moe'" in v.reason


def test_a_new_family_is_one_registry_entry(moe_f32, tmp_path, monkeypatch):
    """A family added by one entry (a spec, here qwen3moe's under another name) is accepted by can_run, read, planned
    and loaded with no other edit, and its replies are the family it copies, bit for bit."""
    path = renamed(moe_f32, tmp_path)
    refused = plugin.can_run(anyformer.describe(path), CAPS, Request())
    assert not refused.ok and refused.code is Refusal.MODEL and NEW in refused.reason

    monkeypatch.setitem(registry.ARCHITECTURES, NEW, dataclasses.replace(qwen3moe.SPEC, name=NEW))
    accepted = plugin.can_run(anyformer.describe(path), CAPS, Request())
    assert accepted.ok, accepted.reason
    assert accepted.estimate.details["architecture"] == NEW
    header = read_gguf_header(path)
    config = registry.read_moe_config(header)
    assert config.architecture == NEW and cpu_engine_class(config) is cpu_engine_class(
        registry.read_moe_config(read_gguf_header(moe_f32))
    )
    assert plan_from_header(header, 64) == plan_from_header(read_gguf_header(moe_f32), 64)

    def steps(gguf: str) -> tuple[np.ndarray, list[int]]:
        loaded = open_or_skip(gguf, device="cpu")
        try:
            return greedy_steps(loaded.engine.forward, steps=4)
        finally:
            loaded.dispose()

    got, tokens = steps(path)
    want, want_tokens = steps(moe_f32)
    assert np.array_equal(got, want) and tokens == want_tokens


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_family_names_engines_of_its_own_device(name):
    """Each spec's engine functions give a CPU and a wgpu engine class (imported only when asked)."""
    from anyformer_diskformer.engines.cpu.moe import CpuMoEEngine
    from anyformer_diskformer.engines.gpu.moe import GpuMoEEngine

    spec = ARCHITECTURES[name]
    assert spec.name == name
    assert issubclass(spec.cpu_engine(), CpuMoEEngine) and issubclass(spec.gpu_engine(), GpuMoEEngine)
