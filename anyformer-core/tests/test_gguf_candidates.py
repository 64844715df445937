"""The GGUF candidates of a description, the quant a name states, and header facts on demand (bounded, cached)."""

from __future__ import annotations

import pathlib

import hub_fixtures
import pytest
from hub_server import FakeHub
from store_helpers import make_gguf

from anyformer.contract._model import Model
from anyformer.plugin import (
    GGUFCandidate,
    choose_gguf_candidate,
    gguf_candidates,
    gguf_facts,
    gguf_quant,
    order_gguf_candidates,
)
from anyformer.store._gguf_facts import MAX_HUB_HEADER_READS, forget_gguf_facts
from anyformer.store._hub import describe_hub

fake_hub = hub_fixtures.fake_hub


def listed(*names: str, size: int = 100) -> Model:
    return Model.from_dict({"repo": "o/r", "files": [{"name": n, "size": size} for n in names]})


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("Qwen3.6-35B-A3B-UD-Q4_K_M.gguf", "Q4_K_M"),
        ("BF16/Qwen3.6-35B-A3B-BF16-00001-of-00002.gguf", "BF16"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
        ("gemma-4-26B_q4_0-it.gguf", "Q4_0"),
        ("LFM2.5-230M-UD-Q4_K_XL.gguf", "Q4_K_XL"),
        ("Ternary-Bonsai-PTQ1_0.gguf", "PTQ1_0"),
        ("model.gguf", None),
        ("gemma-3-4b-it.gguf", None),
    ],
)
def test_gguf_quant_reads_the_publishers_names(name: str, quant: str | None) -> None:
    assert gguf_quant(name) == quant


def test_a_split_set_is_one_candidate_whose_path_is_its_first_shard_and_a_projector_is_none() -> None:
    model = listed(
        "BF16/m-BF16-00002-of-00002.gguf", "BF16/m-BF16-00001-of-00002.gguf", "mmproj-F16.gguf", "m-Q4_0.gguf"
    )
    first, second = gguf_candidates(model)
    assert first.name == "BF16/m-BF16-00001-of-00002.gguf" and first.complete and first.size == 200
    assert first.names == ("BF16/m-BF16-00001-of-00002.gguf", "BF16/m-BF16-00002-of-00002.gguf")
    assert (second.name, second.quant) == ("m-Q4_0.gguf", "Q4_0")


def test_an_incomplete_set_is_listed_with_its_missing_shard_and_never_ordered() -> None:
    (candidate,) = gguf_candidates(listed("m-Q8_0-00001-of-00003.gguf", "m-Q8_0-00003-of-00003.gguf"))
    assert not candidate.complete and candidate.missing == ("m-Q8_0-00002-of-00003.gguf",)
    assert order_gguf_candidates([candidate], ("Q8_0",)) == []


def test_order_puts_the_preference_first_then_the_rest_smallest_first_and_drops_unread_quants() -> None:
    model = Model.from_dict(
        {
            "repo": "o/r",
            "files": [
                {"name": "m-BF16.gguf", "size": 400},
                {"name": "m-IQ2_M.gguf", "size": 50},
                {"name": "m-Q6_K.gguf", "size": 150},
                {"name": "m-Q8_0.gguf", "size": 200},
                {"name": "m-Q4_0.gguf", "size": 100},
            ],
        }
    )
    order = order_gguf_candidates(gguf_candidates(model), ("Q4_0", "Q8_0"), readable=("Q4_0", "Q8_0", "Q6_K", "BF16"))
    assert [c.quant for c in order] == ["Q4_0", "Q8_0", "Q6_K", "BF16"]


@pytest.fixture
def thirty_quants(fake_hub: FakeHub, tmp_path: pathlib.Path) -> str:
    """A repo of 30 GGUFs (tiny, each a valid header), as a publisher of every quant lays one out."""
    data = make_gguf(tmp_path / "m.gguf", tensor_bytes=4096)
    quants = ["Q4_K_M", "Q4_0", "Q8_0", "F16", "BF16", "Q6_K", "Q5_K_M", "Q5_K_S", "Q4_K_S", "Q3_K_M"]
    names = [f"m-{q}-v{i}.gguf" if i else f"m-{q}.gguf" for i in range(3) for q in quants]
    fake_hub.add_repo("org/thirty", {name: data for name in names})
    return "org/thirty"


def _ranged(hub: FakeHub) -> set[str]:
    return {
        path.rsplit("/", 1)[-1] for method, path, headers in hub.requests if method == "GET" and headers.get("range")
    }


def test_headers_are_read_on_demand_bounded_and_cached_per_commit(fake_hub: FakeHub, thirty_quants: str) -> None:
    model = describe_hub(thirty_quants, None)
    assert model.metadata["gguf_file"] == "m-Q4_K_M.gguf"  # describe reads one, not the first listed's only
    candidates = gguf_candidates(model)
    assert len(candidates) == 30
    answers = [gguf_facts(model, c) for c in candidates]
    assert answers[0] is not None and answers[0]["architecture"] == "llama"
    read = _ranged(fake_hub)
    assert len(read) == MAX_HUB_HEADER_READS, read  # describe's read counts too; the rest answer None
    assert sum(a is not None for a in answers) == MAX_HUB_HEADER_READS
    # A later process: nothing in memory, the per-commit cache under ANYFORMER_HOME answers without the Hub.
    forget_gguf_facts()
    fake_hub.requests.clear()
    again = describe_hub(thirty_quants, None)
    assert [gguf_facts(again, c) for c in candidates[:3]] == answers[:3]
    assert _ranged(fake_hub) == set()


def test_a_described_summary_per_file_is_used_as_given() -> None:
    facts = {"architecture": "qwen3moe", "block_count": 4}
    model = Model.from_dict(
        {
            "repo": "o/r",
            "files": [{"name": "a-Q4_0.gguf"}, {"name": "b-Q8_0.gguf"}],
            "metadata": {"gguf_files": {"b-Q8_0.gguf": facts}},
        }
    )
    a, b = gguf_candidates(model)
    assert gguf_facts(model, a) is None and gguf_facts(model, b) == facts


def test_choose_walks_the_order_and_reports_one_line() -> None:
    from anyformer.contract._request import Request
    from anyformer.contract._verdict import Estimate, Refusal, Verdict

    model = listed("m-Q8_0.gguf", "m-Q4_0.gguf")
    seen: list[str] = []

    def judge(candidate: GGUFCandidate, facts: object) -> Verdict:
        seen.append(candidate.name)
        return Verdict.refuse("b", Refusal.MODEL, f"{candidate.name}: no")

    order = order_gguf_candidates(gguf_candidates(model), ("Q4_0", "Q8_0"))
    verdict = choose_gguf_candidate("b", model, Request(), order, judge)
    assert seen == ["m-Q4_0.gguf", "m-Q8_0.gguf"] and verdict.reason == "m-Q4_0.gguf: no"
    accepted = choose_gguf_candidate("b", model, Request(), order, lambda c, f: Verdict.accept("b", Estimate()))
    assert accepted.ok
