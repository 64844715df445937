"""The front door: README's two commands, scripts/test's system packages, and the llama.cpp build's progress.

The 10-minute compile itself is not run here: the progress filter is fed a canned build log, and
the system-package check is given fake requirements and a fake apt-get.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def _script_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


build_progress = _script_module("build_progress")
system_packages = _script_module("system_packages")


def readme_commands() -> list[str]:
    """The commands in README's "Two commands on a fresh machine" section, one per code block."""
    section = README.read_text(encoding="utf-8").split("## Two commands on a fresh machine", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```\n(.*?)```", section, re.DOTALL)]


# ---- the README's two commands -------------------------------------------------------------------


def test_the_readme_has_two_one_line_commands() -> None:
    commands = readme_commands()
    assert len(commands) == 2 and all("\n" not in c for c in commands), commands
    assert commands[0].startswith("bash scripts/install")
    assert commands[1] == "bash scripts/test"


def test_ci_runs_exactly_the_readme_test_command() -> None:
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    assert commands[-1] == readme_commands()[1], "CI must run the README's test command as written"
    assert "set -euo pipefail" in commands, "CI must stop, non-zero, at the first failure"


def test_the_test_script_installs_nothing_into_the_global_python() -> None:
    script = (REPO / "scripts" / "test").read_text()
    assert "python3 -m pip" not in script and "pip install --user" not in script
    assert "python3 -m venv" in script and "set -euo pipefail" in script
    assert script.index("system_packages.py --install") < script.index("-m nox"), "system packages come first"


def test_no_nox_session_lets_an_empty_test_run_pass() -> None:
    # pytest exits 5 when it collects nothing; nox fails a session on any status but 0 unless told otherwise.
    tree = ast.parse((REPO / "noxfile.py").read_text())
    keywords = {kw.arg for node in ast.walk(tree) if isinstance(node, ast.Call) for kw in node.keywords}
    assert "success_codes" not in keywords


def test_install_script_installs_the_serve_and_gpu_probe_extras() -> None:
    script = (REPO / "scripts" / "install").read_text()
    assert "./anyformer-core[serve,gpu-probe]" in script
    assert "build_progress.py" in script and "pip wheel -v" in script


def test_the_readme_says_how_to_reach_the_bare_command_and_the_extras() -> None:
    using = README.read_text(encoding="utf-8").split("## Using it", 1)[1].split("\n## ", 1)[0]
    assert "source .venv/bin/activate" in using and ".venv/bin/anyformer" in using
    assert "anyformer[serve,gpu-probe]" in using and "anyformer --version" in using


def test_the_docs_say_where_the_embedded_model_lives() -> None:
    guide = (REPO / "docs" / "user-guide.md").read_text(encoding="utf-8")
    assert "anyformer.default_model_path()" in guide and "`default` or `smollm2`" in guide


# ---- system packages -----------------------------------------------------------------------------


def _requirement(package: str, present: bool, *, recommends: bool = False) -> Any:
    return system_packages.Requirement(package, "gpu-probe", f"{package} for a test", lambda: present, recommends)


def test_missing_lists_only_what_is_absent() -> None:
    here, absent = _requirement("here", True), _requirement("gone", False)
    assert system_packages.missing([here, absent]) == [absent]


def test_every_group_is_known_and_has_packages() -> None:
    assert system_packages.GROUPS == ("venv", "build", "gpu-probe", "browser")
    packages = {r.package for r in system_packages.REQUIREMENTS}
    assert {"mesa-vulkan-drivers", "libvulkan1", "chromium", "cmake", "build-essential", "python3-venv"} <= packages


def test_without_root_one_line_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(system_packages, "REQUIREMENTS", (_requirement("mesa-vulkan-drivers", False),))
    monkeypatch.setattr(system_packages, "_privilege_prefix", lambda: None)
    monkeypatch.setattr(system_packages.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert system_packages.main(["--install"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "missing system packages: mesa-vulkan-drivers" in err
    assert "sudo apt-get update && sudo apt-get install -y mesa-vulkan-drivers" in err


def test_as_root_apt_get_updates_then_installs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    installed: set[str] = set()
    calls: list[list[str]] = []

    def fake_run(command: list[str], **kwargs: Any) -> None:
        calls.append(command)
        if command[1] == "install":
            installed.update(command)

    requirements = (
        system_packages.Requirement("libvulkan1", "gpu-probe", "loader", lambda: "libvulkan1" in installed),
        system_packages.Requirement("chromium", "browser", "tests", lambda: "chromium" in installed, True),
    )
    monkeypatch.setattr(system_packages, "REQUIREMENTS", requirements)
    monkeypatch.setattr(system_packages, "_privilege_prefix", lambda: [])
    monkeypatch.setattr(system_packages.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(system_packages.subprocess, "run", fake_run)
    assert system_packages.main(["--install"]) == 0
    assert calls[0] == ["apt-get", "update", "-qq"]
    assert calls[1][-2:] == ["--no-install-recommends", "libvulkan1"]
    assert calls[2][-1] == "chromium" and "--no-install-recommends" not in calls[2]  # with its fonts
    assert "installing system packages: libvulkan1 chromium" in capsys.readouterr().err


def test_a_group_checks_only_its_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    requirements = (
        system_packages.Requirement("cmake", "build", "compiling", lambda: True),
        system_packages.Requirement("chromium", "browser", "tests", lambda: False),
    )
    monkeypatch.setattr(system_packages, "REQUIREMENTS", requirements)
    assert system_packages.main(["build"]) == 0
    assert system_packages.main([]) == 1


def test_an_unknown_group_is_refused() -> None:
    with pytest.raises(SystemExit) as exited:
        system_packages.main(["warp-drive"])
    assert exited.value.code == 2


# ---- the llama.cpp build's progress --------------------------------------------------------------

_SRC = "/tmp/pip-install-x/llama-cpp-python_1/vendor/llama.cpp"
_SOURCES = ["ggml/src/ggml.c", "ggml/src/ggml-cpu/ggml-cpu.c", "src/llama.cpp", "src/llama-model.cpp"] * 50


def canned_build_log() -> str:
    """What ``pip wheel -v llama-cpp-python`` prints, shortened: pip's lines, CMake's, and ninja's steps."""
    total = len(_SOURCES) + 1
    lines = [
        "Collecting llama-cpp-python==0.3.36",
        "  Downloading llama_cpp_python-0.3.36.tar.gz (50.5 MB)",
        "  Building wheel for llama-cpp-python (pyproject.toml): started",
        "  *** scikit-build-core 0.11.5 using CMake 3.25.1 (wheel)",
        "  -- The C compiler identification is GNU 12.2.0",
        "  Run Build Command(s): /usr/bin/ninja -v -j 2",
    ]
    for step, source in enumerate(_SOURCES, 1):
        obj = f"vendor/llama.cpp/CMakeFiles/x.dir/{source}.o"
        lines.append(f"  [{step}/{total}] /usr/bin/c++ -DGGML_BUILD -O3 -o {obj} -c {_SRC}/{source}")
        lines.append("  In file included from x.h:3: warning: unused variable")
    lines.append(f"  [{total}/{total}] : && /usr/bin/c++ -fPIC -O3 -shared -o vendor/llama.cpp/bin/libllama.so x.o")
    lines.append("  Created wheel for llama-cpp-python: filename=llama_cpp_python-0.3.36-cp311-linux_x86_64.whl")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("line", "percent", "target"),
    [
        ("[ 42%] Building CXX object vendor/llama.cpp/src/CMakeFiles/llama.dir/llama.cpp.o", 42, "llama.cpp"),
        ("[100%] Linking CXX shared library libllama.so", 100, "libllama.so"),
        ("  [120/240] /usr/bin/cc -O3 -o a/ggml.c.o -c /tmp/src/ggml/src/ggml.c", 50, "ggml.c"),
        ("[3/4] Building C object ggml/src/CMakeFiles/ggml-base.dir/ggml-quants.c.o", 75, "ggml-quants.c"),
        ("[4/4] : && /usr/bin/c++ -shared -o bin/libggml.so a.o", 100, "libggml.so"),
    ],
)
def test_a_build_step_is_read_from_cmake_and_ninja_lines(line: str, percent: int, target: str) -> None:
    assert build_progress.parse_step(line) == build_progress.Step(percent, target)


@pytest.mark.parametrize("line", ["-- Configuring done", "warning: [-Wunused] x", "[0/0] nothing", ""])
def test_other_lines_are_not_steps(line: str) -> None:
    assert build_progress.parse_step(line) is None


def _run_canned(tmp_path: Path, log_text: str, status: int, **kwargs: Any) -> tuple[int, str, Path]:
    canned = tmp_path / "canned.log"
    canned.write_text(log_text)
    program = f"import sys; sys.stdout.write(open({str(canned)!r}).read()); sys.exit({status})"
    out = io.StringIO()
    log = tmp_path / "build.log"
    result = build_progress.run([sys.executable, "-c", program], log=str(log), out=out, **kwargs)
    return result, out.getvalue(), log


def test_the_canned_build_shows_its_percent_and_elapsed_time(tmp_path: Path) -> None:
    status, shown, log = _run_canned(tmp_path, canned_build_log(), 0)
    assert status == 0
    assert log.read_text() == canned_build_log(), "the whole output is kept in the log"
    steps = [int(m) for m in re.findall(r"^  \[\d+:\d\d\] +(\d+)% compiling", shown, re.MULTILINE)]
    assert steps == sorted(steps) and len(steps) == len(set(steps)), "one line per percent, in order"
    assert steps[0] == 0 and steps[-1] == 100 and len(steps) > 50
    targets = set(re.findall(r"% compiling (\S+)", shown))
    assert targets <= {Path(s).name for s in _SOURCES} | {"libllama.so"} and "libllama.so" in targets
    assert "Downloading llama_cpp_python-0.3.36.tar.gz" in shown and "Created wheel" in shown
    assert "warning" not in shown, "compiler chatter stays in the log"
    assert shown.rstrip().endswith("done")
    assert len(shown.splitlines()) < 120, "a few lines for a person, not the compile's output"


def test_a_failed_build_shows_its_last_lines_and_its_exit_status(tmp_path: Path) -> None:
    log_text = canned_build_log() + "  ninja: build stopped: subcommand failed.\n  error: cc1plus: out of memory\n"
    status, shown, log = _run_canned(tmp_path, log_text, 3)
    assert status == 3
    assert "the build failed (exit status 3)" in shown
    tail = [line for line in shown.splitlines() if line.startswith("  | ")]
    assert len(tail) == build_progress.TAIL_LINES and tail[-1].endswith("error: cc1plus: out of memory")
    assert f"the whole output: {log}" in shown


def test_a_quiet_build_says_it_is_still_going(tmp_path: Path) -> None:
    out = io.StringIO()
    program = "import time; print('[1/2] Building C object a.c.o', flush=True); time.sleep(0.8)"
    status = build_progress.run([sys.executable, "-c", program], log=None, heartbeat=0.2, out=out)
    assert status == 0
    assert "still building (50%, at a.c)" in out.getvalue()


def test_a_command_that_cannot_start_fails(tmp_path: Path) -> None:
    out = io.StringIO()
    assert build_progress.run([str(tmp_path / "no-such-program")], log=None, out=out) == 1
    assert "cannot run" in out.getvalue()


def test_elapsed_time_is_minutes_and_seconds() -> None:
    assert [build_progress.format_elapsed(s) for s in (5, 65, 3725)] == ["0:05", "1:05", "1:02:05"]
