"""The ``anyformer`` command in a subprocess: JSON answers, exit codes, and no tracebacks (docs/user-guide.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from anyformer import AnyformerError, ErrorCode, parse_size
from anyformer.cli import _caps_cmd, _main

CHECK_ARGS = ("--caps", "gpu,f16", "--budget", "4GB", "--ram", "16GB", "--json")

#: Every field docs/contract.md ("Capabilities") names.
CONTRACT_CAPS = (
    "gpu",
    "gpu_name",
    "f16",
    "subgroups",
    "gpu_bytes",
    "ram_bytes",
    "store",
    "disk_free_bytes",
    "cpu_count",
)


def _describe(tmp_path: Path, size: int = 100_000_000, name: str = "m.json") -> str:
    (tmp_path / name).write_text(json.dumps({"repo": "org/m", "files": [{"name": "m-Q4_0.gguf", "size": size}]}))
    return name


def assert_clean_failure(result: Any, code: ErrorCode, exit_status: int) -> None:
    """A failure a person can act on: the code on stderr, the given exit status, no traceback."""
    __tracebackhide__ = True
    assert "Traceback" not in result.stderr, result.stderr
    assert f"{code.value}:" in result.stderr, f"expected {code.value} on stderr, got: {result.stderr!r}"
    assert result.returncode == exit_status, f"exit status {result.returncode}, expected {exit_status}"


# ---- check ---------------------------------------------------------------------------------------


def test_check_prints_model_chosen_and_verdicts_and_exits_0(broken_set: Any, run_cli: Any, tmp_path: Path) -> None:
    result = run_cli("check", "--describe", _describe(tmp_path), *CHECK_ARGS, plugins=broken_set)
    assert result.returncode == 0, result.stderr
    answer = result.json()
    assert set(answer) == {"model", "chosen", "verdicts"}
    assert answer["chosen"] == "healthy"
    assert answer["model"]["repo"] == "org/m" and answer["model"]["formats"] == ["gguf"]
    healthy = next(v for v in answer["verdicts"] if v["backend"] == "healthy")
    assert healthy["ok"] is True and healthy["estimate"]["gpu_bytes"] == 100_000_000
    assert answer["verdicts"][0]["backend"] == "healthy"  # the chosen one comes first
    assert "Traceback" not in result.stderr


def test_check_exits_3_when_no_backend_can_run_the_model(broken_set: Any, run_cli: Any, tmp_path: Path) -> None:
    result = run_cli("check", "--describe", _describe(tmp_path, size=10**10), *CHECK_ARGS, plugins=broken_set)
    assert result.returncode == 3, result.stderr
    answer = result.json()
    assert answer["chosen"] is None
    healthy = next(v for v in answer["verdicts"] if v["backend"] == "healthy")
    assert (healthy["code"], healthy["need"]) == ("budget", 10**10)


def test_check_exits_3_with_no_plugins_installed(run_cli: Any, tmp_path: Path) -> None:
    result = run_cli("check", "--describe", _describe(tmp_path), *CHECK_ARGS, env={"ANYFORMER_PLUGINS": "none-at-all"})
    assert result.returncode == 3 and result.json()["chosen"] is None


def test_check_caps_override_reaches_the_plugins(broken_set: Any, run_cli: Any, tmp_path: Path) -> None:
    result = run_cli(
        "check", "--describe", _describe(tmp_path), "--caps", "", "--budget", "4GB", "--json", plugins=broken_set
    )
    assert result.returncode == 3
    healthy = next(v for v in result.json()["verdicts"] if v["backend"] == "healthy")
    assert healthy["code"] == "gpu"


def test_check_table_for_people(broken_set: Any, run_cli: Any, tmp_path: Path) -> None:
    result = run_cli(
        "check", "--describe", _describe(tmp_path), *CHECK_ARGS[:-1], plugins=broken_set, env={"COLUMNS": "200"}
    )
    assert result.returncode == 0 and "chosen: healthy" in result.stdout and "Traceback" not in result.stderr


# ---- bad inputs ----------------------------------------------------------------------------------

_BAD_DESCRIPTIONS = {
    "not-json": "{ this is not json",
    "not-an-object": "[1, 2, 3]",
    "files-not-a-list": '{"repo": "org/m", "files": {"name": "m.gguf"}}',
    "negative-size": '{"repo": "org/m", "files": [{"name": "m.gguf", "size": -5}]}',
    "bool-size": '{"repo": "org/m", "files": [{"name": "m.gguf", "size": true}]}',
    "no-repo": '{"files": []}',
    "file-name-escapes": '{"repo": "org/m", "files": [{"name": "../../etc/passwd", "size": 1}]}',
    "nested-10000-deep": "[" * 10_000 + "]" * 10_000,
    "not-utf8": b"\xff\xfe{}",
}


@pytest.mark.parametrize("content", _BAD_DESCRIPTIONS.values(), ids=_BAD_DESCRIPTIONS.keys())
def test_malformed_description_is_bad_request(broken_set: Any, run_cli: Any, tmp_path: Path, content: Any) -> None:
    path = tmp_path / "m.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    result = run_cli("check", "--describe", "m.json", *CHECK_ARGS, plugins=broken_set)
    assert_clean_failure(result, ErrorCode.BAD_REQUEST, 2)


@pytest.mark.parametrize(
    "args",
    [
        ("--backend", "no-such-backend"),
        ("--budget=-1GB",),
        ("--budget", "-1GB"),
        ("--budget", "4XB"),
        ("--ram", "lots"),
        ("--caps", "gpu,warp-drive"),
        ("--task", " "),
        ("--no-such-option",),
    ],
    ids=lambda a: " ".join(a),
)
def test_bad_arguments_are_bad_request(broken_set: Any, run_cli: Any, tmp_path: Path, args: tuple[str, ...]) -> None:
    result = run_cli("check", "--describe", _describe(tmp_path), "--json", *args, plugins=broken_set)
    assert_clean_failure(result, ErrorCode.BAD_REQUEST, 2)


def test_unknown_backend_lists_the_installed_ones(broken_set: Any, run_cli: Any, tmp_path: Path) -> None:
    result = run_cli("check", "--describe", _describe(tmp_path), "--backend", "nope", *CHECK_ARGS, plugins=broken_set)
    assert "installed:" in result.stderr and "healthy" in result.stderr


def test_negative_budget_says_why(run_cli: Any, tmp_path: Path) -> None:
    result = run_cli("check", "--describe", _describe(tmp_path), "--budget=-1GB", "--caps", "", "--json")
    assert "negative" in result.stderr


def test_model_and_describe_together_is_bad_request(run_cli: Any, tmp_path: Path) -> None:
    result = run_cli("check", "org/m", "--describe", _describe(tmp_path), "--caps", "", "--json")
    assert_clean_failure(result, ErrorCode.BAD_REQUEST, 2)


def test_hostile_gguf_file_is_bad_model(run_cli: Any, tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"this is not a GGUF file at all" * 10)
    result = run_cli("check", "x.gguf", "--caps", "gpu,f16", "--budget", "4GB", "--json")
    assert_clean_failure(result, ErrorCode.BAD_MODEL, 1)
    assert "x.gguf" in result.stderr


def test_truncated_gguf_file_is_bad_model(run_cli: Any, tmp_path: Path) -> None:
    (tmp_path / "cut.gguf").write_bytes(b"GGUF\x03\x00\x00\x00\x01")
    result = run_cli("check", "cut.gguf", "--caps", "", "--json")
    assert_clean_failure(result, ErrorCode.BAD_MODEL, 1)


@pytest.mark.parametrize("ref", ["./missing.gguf", "/no/such/dir/model.onnx", "missing.gguf"])
def test_missing_model_path_is_model_not_found(run_cli: Any, ref: str) -> None:
    result = run_cli("check", ref, "--caps", "", "--json")
    assert_clean_failure(result, ErrorCode.MODEL_NOT_FOUND, 1)


def test_missing_description_file_is_model_not_found(run_cli: Any) -> None:
    result = run_cli("check", "--describe", "nowhere.json", "--caps", "", "--json")
    assert_clean_failure(result, ErrorCode.MODEL_NOT_FOUND, 1)


def test_unknown_command_is_bad_request(run_cli: Any) -> None:
    assert_clean_failure(run_cli("fly"), ErrorCode.BAD_REQUEST, 2)


def test_keyboard_interrupt_exits_130_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(_caps_cmd, "run", interrupted)
    assert _main.main(["caps", "--caps", ""]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_exit_status_follows_the_error_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = {code: 1 for code in ErrorCode} | {
        ErrorCode.BAD_REQUEST: 2,
        ErrorCode.NO_BACKEND: 3,
        ErrorCode.BUDGET_TOO_SMALL: 3,
        ErrorCode.CANCELLED: 130,
    }
    for code, status in expected.items():

        def fails(args: Any, code: ErrorCode = code) -> int:
            raise AnyformerError(code, "it failed", need=5 * 10**9 if code is ErrorCode.BUDGET_TOO_SMALL else None)

        monkeypatch.setattr(_caps_cmd, "run", fails)
        assert _main.main(["caps", "--caps", ""]) == status, code
        err = capsys.readouterr().err
        assert f"anyformer: {code.value}: it failed" in err
        if code is ErrorCode.BUDGET_TOO_SMALL:
            assert "5 GB" in err


# ---- caps ----------------------------------------------------------------------------------------


def test_caps_json_has_every_contract_field(run_cli: Any) -> None:
    result = run_cli("caps", "--json")
    assert result.returncode == 0, result.stderr
    caps = result.json()
    missing = [field for field in CONTRACT_CAPS if field not in caps]
    assert not missing, f"caps --json lacks {missing}"
    assert isinstance(caps["gpu"], bool) and isinstance(caps["cpu_count"], int) and caps["cpu_count"] >= 1
    assert isinstance(caps["ram_bytes"], int) and caps["ram_bytes"] > 0


def test_caps_overrides_answer_a_what_if_question(run_cli: Any) -> None:
    result = run_cli("caps", "--caps", "gpu,f16,store", "--ram", "1.5GiB", "--json")
    assert result.returncode == 0, result.stderr
    caps = result.json()
    assert (caps["gpu"], caps["f16"], caps["subgroups"], caps["store"]) == (True, True, False, True)
    assert caps["ram_bytes"] == 3 * 2**29


def test_caps_table_for_people(run_cli: Any) -> None:
    result = run_cli("caps", "--caps", "gpu", env={"COLUMNS": "200"})
    assert result.returncode == 0 and "shader-f16" in result.stdout


# ---- sizes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4GB", 4 * 10**9),
        ("512MB", 512 * 10**6),
        ("0", 0),
        ("1.5GiB", 3 * 2**29),
        ("4.1GB", 4_100_000_000),
        ("16 gb", 16 * 10**9),
        (" 7 ", 7),
        ("2KiB", 2048),
        ("1T", 10**12),
        (123, 123),
    ],
)
def test_parse_size(text: Any, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    "text",
    ["-1", "-1GB", -1, "4XB", "", "GB", "1e9", "four", "1.2.3GB", "nan", "inf", True, "1" * 5000, "9" * 400 + ".5GB"],
)
def test_parse_size_rejects_with_bad_request(text: Any) -> None:
    with pytest.raises(AnyformerError) as caught:
        parse_size(text)
    assert caught.value.code is ErrorCode.BAD_REQUEST
