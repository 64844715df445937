"""``anyformer caps`` lists which installed backends would use the GPU, from their verdicts on the default model."""

from __future__ import annotations

import json
from typing import Any

import pytest

from anyformer import Caps
from anyformer._selection import Selection
from anyformer.cli import _gpu_backends, _main
from anyformer.contract._verdict import Estimate, Refusal, Verdict

NVIDIA = Caps(gpu=True, gpu_name="NVIDIA H200", gpu_type="DiscreteGPU", gpu_bytes=10**11, gpu_memory_source="nvml")
VERDICTS = (
    Verdict.accept("llamacpp", Estimate(gpu_bytes=0, ram_bytes=10**8, details={"note": "built for the CPU only"})),
    Verdict.accept("localmind", Estimate(gpu_bytes=3 * 10**8, ram_bytes=10**7)),
    Verdict.refuse("onnx", Refusal.FORMAT, "no .onnx file in the repo"),
)


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[Caps]:
    """Every backend answers VERDICTS; the caps each check was asked with are recorded."""
    seen: list[Caps] = []

    def check(model: Any, *, caps: Caps, **kwargs: Any) -> tuple[None, Selection]:
        seen.append(caps)
        return None, Selection(VERDICTS, None)

    monkeypatch.setattr("anyformer._api.check", check)
    return seen


def test_each_backend_says_whether_it_would_use_the_gpu_and_why(asked: list[Caps]) -> None:
    answers = {use.backend: use for use in _gpu_backends.gpu_backends(NVIDIA)}
    assert asked == [NVIDIA]
    assert answers["localmind"].gpu is True
    assert answers["llamacpp"].gpu is False and answers["llamacpp"].why == "built for the CPU only"
    assert answers["onnx"].gpu is False and answers["onnx"].why.startswith("cannot run it: format")


@pytest.mark.parametrize(
    ("caps", "expected"),
    [
        (Caps(), False),
        (Caps(gpu=True, gpu_type="CPU", gpu_memory_source="host"), False),  # a software adapter
        (Caps(gpu_bytes=10**9, gpu_memory_source="nvidia-smi"), True),  # no wgpu, but the driver answers
        (Caps(gpu=True, gpu_type="IntegratedGPU"), True),
    ],
)
def test_only_a_machine_with_a_gpu_is_asked(caps: Caps, expected: bool) -> None:
    assert _gpu_backends.has_gpu(caps) is expected


def test_caps_json_carries_the_list(
    asked: list[Caps], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("anyformer.cli._caps_cmd.caps_from_args", lambda args: NVIDIA)
    assert _main.main(["caps", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["gpu_memory_source"] == "nvml"
    assert {u["backend"]: u["gpu"] for u in printed["gpu_backends"]} == {
        "llamacpp": False,
        "localmind": True,
        "onnx": False,
    }
