"""Every G, S, O, T and P row of docs/safety.md, in several seeds, through ``anyformer.describe``.

The inputs come from :mod:`fault_corpus`. ``describe`` is pure Python (the bounded readers), so it
runs here; anything that hands a file to a native engine runs in an isolated worker (the
llama.cpp sample is in plugins/anyformer-llamacpp/tests/test_fault_corpus_llamacpp.py).
"""

from __future__ import annotations

import os
import pathlib
import re
import time
import tracemalloc
from pathlib import Path

import pytest
from fault_corpus import (
    ACCEPTED,
    ACCEPTED_OR_BAD_MODEL,
    BAD_MODEL,
    MRO_TEMPLATES,
    SPLIT_REFUSED,
    TEMPLATE_REFUSED,
    UNSAFE_FORMAT,
    Fault,
    Link,
    corpus,
    pickle_payload,
)

import anyformer
from anyformer import AnyformerError, Caps, ErrorCode
from anyformer._chat_template import render_chat
from anyformer.files._gguf_header import check_split_set, read_gguf_header

FAULTS = corpus(seeds=3)
#: Rows whose faults must fail fast and small (G3: < 10 ms with O(1) memory; G4, G5: bounded).
_FAST_ROWS = {"G3", "G4", "G5", "G6"}


#: One mark per row, written out so that test_safety_table.py reads them in this file's source.
ROW_MARKS = {
    "G1": pytest.mark.safety("G1"),
    "G2": pytest.mark.safety("G2"),
    "G3": pytest.mark.safety("G3"),
    "G4": pytest.mark.safety("G4"),
    "G5": pytest.mark.safety("G5"),
    "G6": pytest.mark.safety("G6"),
    "G7": pytest.mark.safety("G7"),
    "G8": pytest.mark.safety("G8"),
    "G9": pytest.mark.safety("G9"),
    "G10": pytest.mark.safety("G10"),
    "G11": pytest.mark.safety("G11"),
    "G12": pytest.mark.safety("G12"),
    "G13": pytest.mark.safety("G13"),
    "G14": pytest.mark.safety("G14"),
    "G15": pytest.mark.safety("G15"),
    "G16": pytest.mark.safety("G16"),
    "G17": pytest.mark.safety("G17"),
    "S1": pytest.mark.safety("S1"),
    "O1": pytest.mark.safety("O1"),
    "T1": pytest.mark.safety("T1"),
    "P1": pytest.mark.safety("P1"),
}


def _cases() -> list[object]:
    return [pytest.param(fault, id=fault.id, marks=ROW_MARKS[fault.row]) for fault in FAULTS]


def _describe_error(path: Path) -> AnyformerError | None:
    try:
        anyformer.describe(path)
    except AnyformerError as exc:
        return exc
    return None


def test_no_two_inputs_of_the_corpus_are_the_same_bytes() -> None:
    contents: dict[tuple[object, ...], str] = {}
    for fault in FAULTS:
        key = (tuple(sorted(fault.files.items(), key=lambda item: item[0])), fault.target)
        assert key not in contents, f"{fault.id} repeats {contents[key]} byte for byte"
        contents[key] = fault.id
    assert len({f.row for f in FAULTS}) == len(ROW_MARKS), "every row keeps at least one input"


@pytest.mark.parametrize("fault", _cases())
def test_the_row_states_what_describe_does(fault: Fault, tmp_path: Path) -> None:
    if any(isinstance(c, Link) for c in fault.files.values()) and os.name == "nt":
        pytest.skip("links need privileges on Windows")
    path = fault.write(tmp_path)
    tracemalloc.start()
    started = time.perf_counter()
    error = _describe_error(path)
    elapsed = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    if fault.expect == BAD_MODEL:
        assert error is not None, f"{fault.id}: describe accepted it"
        assert error.code is ErrorCode.BAD_MODEL, f"{fault.id}: {error}"
        for word in fault.words:
            assert word in error.message, f"{fault.id}: {error.message!r} does not say {word!r}"
    elif fault.expect == ACCEPTED_OR_BAD_MODEL:
        assert error is None or error.code is ErrorCode.BAD_MODEL, f"{fault.id}: {error}"
    else:
        assert error is None, f"{fault.id}: describe refused it: {error}"
    if fault.row in _FAST_ROWS:
        assert elapsed < 0.25, f"{fault.id}: describe took {elapsed * 1e3:.0f} ms"
        assert peak < 4 * 2**20, f"{fault.id}: describe peaked at {peak / 2**20:.1f} MiB"


@pytest.mark.parametrize("fault", [f for f in FAULTS if f.expect == TEMPLATE_REFUSED], ids=lambda f: f.id)
@pytest.mark.safety("G16")
def test_a_template_reaching_for_the_mro_is_refused_when_rendered(fault: Fault, tmp_path: Path) -> None:
    template = read_gguf_header(fault.write(tmp_path)).get("tokenizer.chat_template")
    with pytest.raises(AnyformerError) as caught:
        render_chat(template, [{"role": "user", "content": "hi"}])
    assert caught.value.code is ErrorCode.BAD_MODEL and "unsafe" in caught.value.message


@pytest.mark.safety("G16")
@pytest.mark.parametrize("template", MRO_TEMPLATES)
def test_render_chat_refuses_every_mro_template_and_runs_nothing(template: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    attack = template + f"{{{{ cycler.__init__.__globals__.os.popen('touch {marker}') }}}}"
    with pytest.raises(AnyformerError) as caught:
        render_chat(attack, [{"role": "user", "content": "hi"}])
    assert caught.value.code is ErrorCode.BAD_MODEL
    assert not marker.exists()


@pytest.mark.parametrize("fault", [f for f in FAULTS if f.expect == SPLIT_REFUSED], ids=lambda f: f.id)
@pytest.mark.safety("S1")
def test_a_broken_split_set_is_bad_model_naming_the_shard(fault: Fault, tmp_path: Path) -> None:
    folder = fault.write(tmp_path)
    anyformer.describe(folder)  # every shard on its own is a valid GGUF
    headers = [(p.name, read_gguf_header(p)) for p in sorted(folder.glob("*.gguf"))]
    with pytest.raises(AnyformerError) as caught:
        check_split_set(headers)
    assert caught.value.code is ErrorCode.BAD_MODEL
    for word in fault.words:
        assert word in caught.value.message, f"{fault.id}: {caught.value.message!r} does not say {word!r}"


@pytest.mark.parametrize("fault", [f for f in FAULTS if f.expect == UNSAFE_FORMAT], ids=lambda f: f.id)
@pytest.mark.safety("P1")
def test_pickle_weights_are_listed_and_never_loaded(fault: Fault, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)  # the payload would touch PICKLE_RAN here
    path = fault.write(tmp_path)
    model = anyformer.describe(path)
    assert model.formats == ("pickle",)
    assert [f.format for f in model.files if f.name.endswith((".bin", ".pt", ".pth", ".ckpt"))] == ["pickle"]
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(path, caps=Caps(ram_bytes=16 * 2**30), plugins=anyformer.PluginManager())
    assert caught.value.code is ErrorCode.UNSAFE_FORMAT and "pickle" in caught.value.message
    assert not (tmp_path / "PICKLE_RAN").exists()


@pytest.mark.safety("P1")
def test_pickle_beside_safe_weights_does_not_block_the_safe_ones(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(pickle_payload("PICKLE_RAN"))
    (tmp_path / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    model = anyformer.describe(tmp_path)
    assert model.formats == ("safetensors", "pickle")
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(tmp_path, caps=Caps(ram_bytes=16 * 2**30), plugins=anyformer.PluginManager())
    assert caught.value.code is ErrorCode.NO_BACKEND


# Code that would unpickle: the pickle module and its relatives, torch.load, numpy's allow_pickle.
_UNPICKLING = re.compile(
    r"^\s*(import|from)\s+(c?pickle|_pickle|dill|cloudpickle|joblib|shelve|marshal)\b"
    r"|\b(c?pickle|dill|joblib|torch|shelve|marshal)\.loads?\("
    r"|\bUnpickler\b|allow_pickle\s*=\s*True|\bnp\.load\(|\bnumpy\.load\(",
    re.MULTILINE,
)
_REPO = pathlib.Path(__file__).resolve().parents[2]


def _source_files() -> list[Path]:
    roots = [_REPO / "anyformer-core" / "src", *(_REPO / "plugins").glob("*/src")]
    return sorted(p for root in roots for p in root.rglob("*.py"))


@pytest.mark.safety("P1")
def test_no_code_path_unpickles() -> None:
    files = _source_files()
    assert any(p.name == "_api.py" for p in files), "the scan found none of the core's source"
    hits = [
        f"{p.relative_to(_REPO)}: {m.group(0).strip()}"
        for p in files
        for m in _UNPICKLING.finditer(p.read_text(encoding="utf-8"))
    ]
    assert hits == [], "code that can unpickle: " + "; ".join(hits)


@pytest.mark.parametrize(
    "line",
    [
        "import pickle",
        "from pickle import loads",
        "x = torch.load(path)",
        "np.load(f, allow_pickle=True)",
        "import cloudpickle",
        "pickle.loads(data)",
    ],
)
def test_the_unpickling_scan_sees_each_way_in(line: str) -> None:
    assert _UNPICKLING.search(f"def f():\n    {line}\n")


def test_the_corpus_covers_every_g_s_o_t_p_row() -> None:
    table = _REPO / "docs" / "safety.md"
    rows = {f.row for f in FAULTS}
    expected = set(re.findall(r"^\|\s*([GSOTP]\d+)\s*\|", table.read_text(encoding="utf-8"), re.MULTILINE))
    assert {f"G{i}" for i in range(1, 18)} | {"S1", "O1", "T1", "P1"} <= expected, "the safety table lost rows"
    assert expected <= rows, f"rows without corpus inputs: {sorted(expected - rows)}"
    # P1's inputs are file names alone (pickle weights are never read), so no seed changes them.
    single = {row for row in rows if not any(f.row == row and f.seed == 2 for f in FAULTS)}
    assert single == {"P1"}, f"rows whose inputs no longer vary across the 3 seeds: {sorted(single)}"
    assert {ACCEPTED, BAD_MODEL, ACCEPTED_OR_BAD_MODEL} <= {f.expect for f in FAULTS}
