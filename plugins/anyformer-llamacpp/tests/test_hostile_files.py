"""Hostile GGUFs given to the llama.cpp backend: BAD_MODEL, never a crash or a hang.

Each case runs ``anyformer.load(path, backend="llamacpp")`` in a child process with a time limit,
so a crash inside native code would show as a signal, not as a dead test runner.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from tiny_gguf import write_tiny_llama

_LOAD = """
import json, sys, anyformer
try:
    anyformer.load(sys.argv[1], backend="llamacpp")
    print(json.dumps({"code": None}))
except anyformer.AnyformerError as exc:
    print(json.dumps({"code": exc.code.value, "message": exc.message}))
"""


def _load_in_child(path: Path) -> dict[str, str | None]:
    done = subprocess.run([sys.executable, "-c", _LOAD, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"the child died with {done.returncode}: {done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _first_tensor_offset_field(data: bytes) -> int:
    name = b"token_embd.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    (n_dims,) = struct.unpack_from("<I", data, at)
    return at + 4 + 8 * n_dims + 4


def _truncate_half(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _one_byte_short(data: bytes) -> bytes:
    return data[:-1]


def _wrong_magic(data: bytes) -> bytes:
    return b"GGML" + data[4:]


def _version_99(data: bytes) -> bytes:
    return data[:4] + struct.pack("<I", 99) + data[8:]


def _n_tensors_2_40(data: bytes) -> bytes:
    return data[:8] + struct.pack("<Q", 2**40) + data[16:]


def _string_2_40(data: bytes) -> bytes:
    return data[:24] + struct.pack("<Q", 2**40) + data[32:]  # the first key's length


def _offset_past_end(data: bytes) -> bytes:
    field = _first_tensor_offset_field(data)
    return data[:field] + struct.pack("<Q", len(data) * 4) + data[field + 8 :]


def _offset_max(data: bytes) -> bytes:
    field = _first_tensor_offset_field(data)
    return data[:field] + struct.pack("<Q", 2**64 - 1) + data[field + 8 :]


CASES: dict[str, Callable[[bytes], bytes]] = {
    "truncated at 50%": _truncate_half,
    "one byte short": _one_byte_short,
    "wrong magic": _wrong_magic,
    "version 99": _version_99,
    "header claims 2^40 tensors": _n_tensors_2_40,
    "a 2^40-byte string": _string_2_40,
    "tensor offset past the end": _offset_past_end,
    "tensor offset 2^64-1": _offset_max,
}


@pytest.fixture(scope="module")
def clean_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return write_tiny_llama(tmp_path_factory.mktemp("clean") / "clean.gguf").read_bytes()


@pytest.mark.safety("G1", "G2", "G3", "G4", "G12")
@pytest.mark.parametrize("case", list(CASES))
def test_hostile_gguf_is_bad_model_in_a_child_process(case: str, clean_bytes: bytes, tmp_path: Path) -> None:
    path = tmp_path / "hostile-Q4_0.gguf"
    path.write_bytes(CASES[case](clean_bytes))
    result = _load_in_child(path)
    assert result["code"] == "BAD_MODEL", f"{case}: {result}"


@pytest.mark.safety("G17")
def test_absurd_architecture_numbers_are_bad_model_before_llamacpp_allocates(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "absurd.gguf", overrides={"block_count": 10000})
    result = _load_in_child(path)
    assert result["code"] == "BAD_MODEL" and "block_count = 10000" in (result["message"] or "")


def test_clean_file_loads(clean_bytes: bytes, tmp_path: Path) -> None:
    path = tmp_path / "clean.gguf"
    path.write_bytes(clean_bytes)
    assert _load_in_child(path)["code"] is None
