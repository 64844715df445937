"""The fuzz harness's short share in CI: a few hundred mutated model files; the long run is ``nox -s fuzz``."""

from __future__ import annotations

import importlib.util
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "fuzz" / "fuzz_model_files.py"


@pytest.fixture(scope="module")
def fuzz() -> Iterator[ModuleType]:
    """The harness module, with its alarm handler installed for the per-input time limit."""
    spec = importlib.util.spec_from_file_location("fuzz_model_files", HARNESS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    previous = signal.signal(signal.SIGALRM, module._on_alarm)
    yield module
    signal.signal(signal.SIGALRM, previous)
    sys.modules.pop(spec.name, None)


@pytest.mark.safety("G1", "G2", "T1", "O1")
@pytest.mark.parametrize("seed", range(3))
def test_mutated_model_files_only_ever_raise_anyformer_errors(fuzz: ModuleType, tmp_path: Path, seed: int) -> None:
    target = fuzz.Target(tmp_path)
    fuzz.run_random(target, fuzz.seeds(), 150, seed)
    assert target.count == 150
    formats = {key.split(":")[0] for key in target.outcomes}
    assert formats == {"gguf", "safetensors", "onnx"}, f"every format was fuzzed: {dict(target.outcomes)}"
    assert any(key.endswith(":BAD_MODEL") for key in target.outcomes)


def test_the_seeds_are_valid_files_and_the_hostile_templates_are_refused(fuzz: ModuleType, tmp_path: Path) -> None:
    target = fuzz.Target(tmp_path)
    for seed in fuzz.seeds():
        target(seed)
    files = {key: count for key, count in target.outcomes.items() if ":template:" not in key}
    assert all(key.endswith(":ok") for key in files), dict(target.outcomes)
    assert target.outcomes["gguf:template:ok"] >= 1  # the tiny llama's ChatML template renders
    assert target.outcomes["gguf:template:BAD_MODEL"] == len(fuzz.HOSTILE_TEMPLATES), dict(target.outcomes)


def test_an_escaping_exception_is_a_finding(fuzz: ModuleType) -> None:
    def broken() -> None:
        raise IndexError("a reader bug")

    with pytest.raises(fuzz.Finding, match="IndexError escaped"):
        fuzz._outcome(broken)


def test_an_error_wrapping_memory_error_is_a_finding(fuzz: ModuleType) -> None:
    from anyformer import AnyformerError

    def allocates() -> None:
        raise AnyformerError("BAD_MODEL", "unreadable", cause=MemoryError())

    with pytest.raises(fuzz.Finding, match="wraps MemoryError"):
        fuzz._outcome(allocates)


def test_a_slow_input_is_stopped_by_the_alarm(
    fuzz: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fuzz, "TIME_LIMIT_SECONDS", 0.05)
    target = fuzz.Target(tmp_path)
    monkeypatch.setattr(target, "_check", lambda data: [None for _ in iter(int, 1)])
    with pytest.raises(fuzz.InputTimeout):
        target(b"\x00")
