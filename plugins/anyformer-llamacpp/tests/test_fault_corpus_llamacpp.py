"""A sample of the core's fault corpus (one seed of every GGUF row) loaded on llama.cpp in a worker.

The core's readers refuse most of these in ``describe``, before any worker starts; those that pass
(a zero dimension, a template, absurd architecture numbers) reach the back end in the worker. Either
way the answer is ``BAD_MODEL`` or, had llama.cpp died, ``BACKEND_CRASHED``, and this process lives on.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "anyformer-core" / "tests"))

from fault_corpus import Fault, corpus

import anyformer
from anyformer import AnyformerError, ErrorCode

SAMPLE = [f for f in corpus(seeds=1) if f.row.startswith("G") and f.target.endswith(".gguf")]


@pytest.mark.safety("G14", "G16", "G17")
@pytest.mark.parametrize("fault", SAMPLE, ids=lambda f: f.id)
def test_a_hostile_gguf_on_llamacpp_in_a_worker_is_bad_model(fault: Fault, tmp_path: Path, tiny_gguf: Path) -> None:
    path = fault.write(tmp_path)
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(path, backend="llamacpp", isolate=True).dispose()
    assert caught.value.code in (ErrorCode.BAD_MODEL, ErrorCode.BACKEND_CRASHED), f"{fault.id}: {caught.value}"


def test_the_sample_holds_every_gguf_row() -> None:
    assert {f.row for f in SAMPLE} == {f"G{i}" for i in range(1, 18)}
