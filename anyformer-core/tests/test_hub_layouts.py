"""``anyformer check`` on real Hub repo layouts (tests/data/hub_layouts), with every installed backend.

Each layout is served by the Hub stand-in at its real sizes with tiny stand-in contents (GGUF
headers, configs; hub_layouts.py). Each of its ``checks`` names a machine and what issue 26 expects
``check`` to answer there: the backend the policy chooses, and per backend the file its estimate
names first or the refusal code. An expectation marked ``pending`` in the data waits for another
branch (named in the reason) and is a strict xfail until then: when that branch lands, the test
XPASSes and fails, and the mark is to be removed from the data file.

``nox -s layouts`` installs every backend and runs this module; docs/hub-layouts.md is the table
scripts/hub_layouts_table.py writes from the same checks.
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import pytest
from hub_fixtures import fake_hub
from hub_layouts import Layout, LayoutCheck, gguf_header, load_layouts, quant_in_name, serve_layout, stand_in_files

from anyformer import Caps, check
from anyformer._plugins import get_plugin_manager
from anyformer._selection import Selection
from anyformer.contract._model import Model
from anyformer.contract._sizes import parse_size
from anyformer.contract._verdict import Refusal, Verdict

__all__ = ["fake_hub"]

LAYOUTS = load_layouts()
CHECKS = [(layout, entry) for layout in LAYOUTS for entry in layout.checks]
#: Every backend some expectation names.
EXPECTED_BACKENDS = {b for _, entry in CHECKS for b in [*entry.verdicts, entry.chosen] if b is not None}
#: What check answered, per (layout, check): several tests read one answer.
_ANSWERS: dict[tuple[str, str], tuple[Model, Selection]] = {}


def machine_caps(machine: dict[str, Any], store: pathlib.Path) -> Caps:
    """The what-if machine a check describes, as ``--caps``, ``--ram`` (and a GPU's memory) set it."""
    flags = [flag for flag in str(machine.get("caps", "store")).split(",") if flag]
    gpu_bytes = parse_size(machine["gpu_bytes"]) if "gpu_bytes" in machine else None
    caps = Caps(
        ram_bytes=parse_size(machine.get("ram", "16GB")),
        gpu_bytes=gpu_bytes if "gpu" in flags else None,
        gpu_name="stand-in adapter" if "gpu" in flags else None,
        cpu_count=8,
        store_path=str(store),
        disk_free_bytes=parse_size("2TB"),
    )
    return caps.with_flags(flags)


def answer(layout: Layout, entry: LayoutCheck, request: pytest.FixtureRequest) -> tuple[Model, Selection]:
    """``check`` on ``layout`` for ``entry``'s machine (asked once per module)."""
    key = (layout.key, entry.name)
    if key not in _ANSWERS:
        hub = request.getfixturevalue("fake_hub")
        tmp = request.getfixturevalue("tmp_path")
        # A revision per check: each check answers as a fresh `anyformer check` process would.
        serve_layout(hub, layout, revision=entry.name)
        caps = machine_caps(entry.machine, tmp / "store")
        _ANSWERS[key] = check(f"{layout.repo}@{entry.name}", caps=caps, budget=entry.machine.get("budget"))
    return _ANSWERS[key]


def installed_backends() -> set[str]:
    """The backend ids the plugin host loaded."""
    return set(get_plugin_manager().backends())


def verdict_of(selection: Selection, backend: str) -> Verdict:
    """The verdict ``backend`` gave (it is installed and was asked)."""
    __tracebackhide__ = True
    found = [v for v in selection.verdicts if v.backend == backend]
    assert found, f"no verdict from {backend}; verdicts from {[v.backend for v in selection.verdicts]}"
    return found[0]


def describe_verdict(verdict: Verdict) -> str:
    """One line: the verdict as ``check`` shows it (ok with its first file, or the refusal and why)."""
    if verdict.ok:
        assert verdict.estimate is not None
        return f"ok, file {verdict.estimate.files[0] if verdict.estimate.files else '?'}"
    return f"{verdict.code.value if verdict.code else '?'}: {verdict.reason}"


def _expectation_params() -> list[Any]:
    params = []
    for layout, entry in CHECKS:
        for backend, expected in sorted(entry.verdicts.items()):
            marks = [pytest.mark.xfail(strict=True, reason=expected["pending"])] if "pending" in expected else []
            params.append(
                pytest.param(layout, entry, backend, expected, id=f"{layout.key}-{entry.name}-{backend}", marks=marks)
            )
    return params


def _chosen_params() -> list[Any]:
    params = []
    for layout, entry in CHECKS:
        marks = [pytest.mark.xfail(strict=True, reason=entry.chosen_pending)] if entry.chosen_pending else []
        params.append(pytest.param(layout, entry, id=f"{layout.key}-{entry.name}", marks=marks))
    return params


# -- the data --------------------------------------------------------------------------------------


def test_at_least_twenty_five_layouts_cover_the_publishers_the_issue_names() -> None:
    repos = {layout.repo for layout in LAYOUTS}
    assert len(repos) >= 25
    pinned = {
        "google/gemma-4-26B-A4B-it-qat-q4_0-gguf",
        "unsloth/Qwen3.6-35B-A3B-GGUF",
        "openbmb/MiniCPM-V-4.7-35B-A3B-gguf",
        "inclusionAI/Ling-3.0-flash-GGUF",
        "LiquidAI/LFM2.5-230M-GGUF",
    }
    assert pinned <= repos
    owners = {repo.split("/")[0] for repo in repos}
    for publisher in ("unsloth", "bartowski", "ggml-org", "lmstudio-community", "google", "LiquidAI", "TheBloke"):
        assert publisher in owners, publisher
    assert any(repo.startswith(("onnx-community/", "Xenova/")) for repo in repos)
    assert any("text-diffusion" in layout.tags for layout in LAYOUTS)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.key)
def test_a_layout_cites_its_source_and_says_which_sizes_are_real(layout: Layout) -> None:
    assert layout.sources and all(source.strip() for source in layout.sources)
    assert re.split("[,:]", layout.sizes)[0] in ("real", "estimated", "mixed"), layout.sizes
    assert layout.real_sizes == layout.sizes.startswith("real"), "the per-file marks and the summary disagree"
    assert all(f.size > 0 for f in layout.files)
    assert len({f.name for f in layout.files}) == len(layout.files)
    raw = (pathlib.Path(__file__).parent / "data" / "hub_layouts" / f"{layout.key}.json").stat().st_size
    assert raw < 20_000, "a listing, not contents"
    for entry in layout.checks:
        for expected in entry.verdicts.values():
            assert ("file" in expected) != ("refusal" in expected), expected
            if "refusal" in expected:
                Refusal(expected["refusal"])


def test_quant_names_are_read_as_publishers_write_them() -> None:
    assert quant_in_name("Qwen3.6-35B-A3B-UD-Q4_K_XL.gguf") == "Q4_K_XL"
    assert quant_in_name("BF16/Qwen3.6-35B-A3B-BF16-00001-of-00002.gguf") == "BF16"
    assert quant_in_name("gemma-4-26B_q4_0-it.gguf") == "Q4_0"
    assert quant_in_name("minicpm3-4b-fp16.gguf") == "F16"
    assert quant_in_name("unsloth.Q5_K_M.gguf") == "Q5_K_M"
    assert quant_in_name("Qwen1.5-4B.IQ4_XS.gguf") == "IQ4_XS"
    assert quant_in_name("LFM2-350M-Q4_K_M-hip-optimized.gguf") == "Q4_K_M"
    assert quant_in_name("model.gguf") is None


# -- the stand-in ------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout.key)
def test_the_stand_in_lists_the_real_names_sizes_tags_and_task(fake_hub: Any, layout: Layout) -> None:
    from huggingface_hub import HfApi

    serve_layout(fake_hub, layout)
    info = HfApi().model_info(layout.repo, files_metadata=True)
    assert [(s.rfilename, s.size) for s in info.siblings or []] == [(f.name, f.size) for f in layout.files]
    assert list(info.tags or []) == list(layout.tags)
    assert info.pipeline_tag == layout.pipeline_tag
    assert info.library_name == layout.library_name


GGUF_LAYOUTS = [layout for layout in LAYOUTS if any(f.name.endswith(".gguf") for f in layout.files)]


@pytest.mark.parametrize("layout", GGUF_LAYOUTS, ids=lambda layout: layout.key)
def test_describe_reads_the_stand_in_header_by_range_requests(fake_hub: Any, layout: Layout) -> None:
    from anyformer import describe

    serve_layout(fake_hub, layout)
    model = describe(layout.repo)
    summary, name = model.metadata["gguf"], model.metadata["gguf_file"]
    assert summary["architecture"] == layout.model["architecture"]
    assert summary["block_count"] == layout.model["block_count"]
    assert summary["vocab_size"] == layout.model["vocab_size"]
    assert summary["expert_count"] == layout.model.get("expert_count")
    listed = next(f for f in layout.files if f.name == name)
    assert summary["data_bytes"] <= listed.size if not summary["split"] else True
    # Only the header was fetched: a few MB of a multi-GB file.
    fetched = sum(1 for method, _, _ in fake_hub.requests_for(name.rsplit("/", 1)[-1]) if method == "GET")
    assert 1 <= fetched <= 8


def test_a_stand_in_gguf_reads_with_ggufs_own_reader(tmp_path: pathlib.Path) -> None:
    """The header is gguf's: its reader opens a (sparse) file of the stand-in at its listed size."""
    import gguf

    layout = next(layout for layout in LAYOUTS if layout.key == "liquidai-lfm2-350m-gguf")
    stand_in = stand_in_files(layout)["LFM2-350M-Q4_0.gguf"]
    path = tmp_path / "stand-in.gguf"
    with path.open("wb") as f:
        f.write(stand_in.prefix)
        f.truncate(stand_in.size)  # sparse: no 219 MB written
    reader = gguf.GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == "lfm2"
    kinds = {gguf.GGMLQuantizationType(t.tensor_type).name for t in reader.tensors}
    assert "Q4_0" in kinds and "F32" in kinds
    assert max(t.data_offset + t.n_bytes for t in reader.tensors) <= stand_in.size


def test_a_split_sets_shards_share_its_tensors_and_name_their_place() -> None:
    layout = next(layout for layout in LAYOUTS if layout.key == "unsloth-qwen3.6-35b-a3b-gguf")
    files = stand_in_files(layout)
    from anyformer.files._gguf_header import read_gguf_header

    heads = []
    for part in (1, 2):
        name = f"BF16/Qwen3.6-35B-A3B-BF16-0000{part}-of-00002.gguf"
        heads.append(read_gguf_header(_StandInSource(files[name]), name=name))
    first, second = (h.summary() for h in heads)
    assert first["split"] == {"no": 0, "count": 2, "tensors_count": first["split"]["tensors_count"]}
    assert second["split"]["no"] == 1 and second["architecture"] is None
    assert first["tensor_count"] + second["tensor_count"] == first["split"]["tensors_count"]
    assert gguf_header("llama", {}, [], None, first=False, split=(1, 2, 0))[:4] == b"GGUF"


class _StandInSource:
    """A byte source over a stand-in at its full size (zeros after the prefix), for the core's reader."""

    def __init__(self, stand_in: Any) -> None:
        self._stand_in = stand_in

    @property
    def size(self) -> int:
        return int(self._stand_in.size)

    def read_at(self, offset: int, length: int) -> bytes:
        end = min(self.size, offset + length)
        head = self._stand_in.prefix[offset:end]
        return head + bytes(max(0, end - offset - len(head)))


# -- check -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("layout", "entry", "backend", "expected"), _expectation_params())
def test_a_backend_answers_what_the_issue_expects(
    layout: Layout, entry: LayoutCheck, backend: str, expected: dict[str, str], request: pytest.FixtureRequest
) -> None:
    if backend not in installed_backends():
        pytest.skip(f"{backend} is not installed")
    _, selection = answer(layout, entry, request)
    verdict = verdict_of(selection, backend)
    if "file" in expected:
        assert verdict.ok, f"{backend} refused {layout.repo}: {describe_verdict(verdict)}; expected {expected['file']}"
        assert verdict.estimate is not None and verdict.estimate.files, f"{backend} named no file"
        assert verdict.estimate.files[0] == expected["file"], f"{backend} chose {verdict.estimate.files[0]}"
    else:
        assert not verdict.ok, f"{backend} accepted {layout.repo} ({describe_verdict(verdict)})"
        assert verdict.code is not None and verdict.code.value == expected["refusal"], describe_verdict(verdict)


@pytest.mark.parametrize(("layout", "entry"), _chosen_params())
def test_the_policy_chooses_the_engine_written_for_the_model(
    layout: Layout, entry: LayoutCheck, request: pytest.FixtureRequest
) -> None:
    missing = EXPECTED_BACKENDS - installed_backends()
    if missing:
        # The policy picks among all of them: with one missing, another may rightly be chosen.
        pytest.skip(f"{', '.join(sorted(missing))} not installed (nox -s layouts installs every backend)")
    _, selection = answer(layout, entry, request)
    table = "; ".join(f"{v.backend}: {describe_verdict(v)}" for v in selection.verdicts)
    assert selection.chosen_backend == entry.chosen, table


@pytest.mark.parametrize(("layout", "entry"), [pytest.param(*c, id=f"{c[0].key}-{c[1].name}") for c in CHECKS])
def test_every_backend_answers_and_every_refusal_says_why_in_one_line(
    layout: Layout, entry: LayoutCheck, request: pytest.FixtureRequest
) -> None:
    _, selection = answer(layout, entry, request)
    assert {v.backend for v in selection.verdicts} == installed_backends()
    for verdict in selection.verdicts:
        if not verdict.ok:
            assert verdict.reason.strip() and "\n" not in verdict.reason, (verdict.backend, verdict.reason)


MANY_QUANTS = [layout for layout in GGUF_LAYOUTS if sum(f.name.endswith(".gguf") for f in layout.files) >= 6]


@pytest.mark.parametrize("layout", MANY_QUANTS, ids=lambda layout: layout.key)
def test_a_check_reads_a_few_headers_not_one_per_quant_and_downloads_no_weights(fake_hub: Any, layout: Layout) -> None:
    from anyformer.store._gguf_facts import MAX_HUB_HEADER_READS

    serve_layout(fake_hub, layout, revision="header-reads")
    caps = machine_caps(
        {"caps": "gpu,f16,subgroups,store", "ram": "16GB", "gpu_bytes": "8GB"}, pathlib.Path("/nonexistent")
    )
    fake_hub.reset()
    check(f"{layout.repo}@header-reads", caps=caps)
    gets = [(path, headers) for method, path, headers in fake_hub.requests if method == "GET" and ".gguf" in path]
    assert all("range" in headers for _, headers in gets), "a GGUF was downloaded whole"
    read = {path.split("?")[0] for path, _ in gets}
    # describe reads the first-listed header; the backends' own asks share a budget per commit.
    assert len(read) <= 1 + MAX_HUB_HEADER_READS, sorted(read)


def test_the_clis_json_gives_the_same_verdicts(fake_hub: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from anyformer.cli._main import main

    layout = next(layout for layout in LAYOUTS if layout.key == "liquidai-lfm2-350m-gguf")
    serve_layout(fake_hub, layout)
    status = main(["check", layout.repo, "--json", "--caps", "store", "--ram", "16GB"])
    out = json.loads(capsys.readouterr().out)
    assert status == (0 if out["chosen"] else 3)
    llamacpp = next(v for v in out["verdicts"] if v["backend"] == "llamacpp")
    assert llamacpp["ok"] and llamacpp["estimate"]["files"][0] == "LFM2-350M-Q4_K_M.gguf"
