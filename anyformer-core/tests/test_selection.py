"""The selection policy, exactly as docs/contract.md ("Selection") writes it, and the verdicts it works on."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

import anyformer
from anyformer import AnyformerError, Caps, ErrorCode, Estimate, PluginManager, Rank, Refusal, Verdict, hookimpl, select
from anyformer.plugin import BackendModel


def ok(backend: str, rank: Rank = Rank.GENERAL, tok_per_sec: float | None = None) -> Verdict:
    return Verdict.accept(backend, Estimate(ram_bytes=1, tok_per_sec=tok_per_sec, rank=rank))


def refused(backend: str, code: Refusal = Refusal.FORMAT, need: int | None = None) -> Verdict:
    return Verdict.refuse(backend, code, f"{backend} says no", need=need)


def order(verdicts: list[Verdict], prefer: tuple[str, ...] = ()) -> list[str]:
    return [v.backend for v in select(verdicts, prefer).verdicts]


# ---- the order -----------------------------------------------------------------------------------


def test_preference_list_comes_before_rank_and_speed() -> None:
    verdicts = [ok("fast-specialist", Rank.SPECIALIST, 500.0), ok("slow-fallback", Rank.FALLBACK, 1.0)]
    assert select(verdicts, ("slow-fallback",)).chosen_backend == "slow-fallback"


def test_preference_list_is_taken_in_its_own_order() -> None:
    verdicts = [ok("a"), ok("b"), ok("c")]
    assert order(verdicts, ("c", "a")) == ["c", "a", "b"]


def test_preferred_backend_that_refused_is_skipped() -> None:
    selection = select([refused("wanted"), ok("other", Rank.FALLBACK)], ("wanted",))
    assert selection.chosen_backend == "other"


def test_unknown_names_in_the_preference_list_are_ignored() -> None:
    assert select([ok("a", Rank.FALLBACK), ok("b", Rank.SPECIALIST)], ("not-installed",)).chosen_backend == "b"


def test_rank_orders_specialist_then_general_then_fallback_whatever_the_speed() -> None:
    verdicts = [
        ok("llamacpp", Rank.FALLBACK, 900.0),
        ok("onnx", Rank.GENERAL, 500.0),
        ok("localmind", Rank.SPECIALIST, 1.0),
    ]
    assert order(verdicts) == ["localmind", "onnx", "llamacpp"]


def test_among_equal_ranks_the_higher_tok_per_sec_wins_and_unknown_speed_is_last() -> None:
    verdicts = [
        ok("unmeasured"),
        ok("slow", tok_per_sec=0.5),
        ok("fast", tok_per_sec=75.0),
        ok("zero", tok_per_sec=0.0),
    ]
    assert order(verdicts) == ["fast", "slow", "zero", "unmeasured"]


def test_full_ties_are_broken_by_backend_id() -> None:
    assert order([ok("zeta", tok_per_sec=5.0), ok("alpha", tok_per_sec=5.0), ok("mid", tok_per_sec=5.0)]) == [
        "alpha",
        "mid",
        "zeta",
    ]


def test_refusals_come_after_every_runnable_verdict() -> None:
    verdicts = [refused("a-refuser"), ok("z-runner", Rank.FALLBACK), refused("b-refuser", Refusal.GPU)]
    ordered = select(verdicts).verdicts
    assert [v.ok for v in ordered] == [True, False, False]
    assert [v.backend for v in ordered[1:]] == ["a-refuser", "b-refuser"]


def test_the_order_does_not_depend_on_the_order_plugins_answered() -> None:
    verdicts = [
        ok("kohra", Rank.SPECIALIST, 20.0),
        ok("localmind", Rank.SPECIALIST, 20.0),
        ok("onnx", Rank.GENERAL, 30.0),
        ok("llamacpp", Rank.FALLBACK),
        refused("diskformer", Refusal.GPU),
    ]
    expected = order(verdicts)
    assert expected == ["kohra", "localmind", "onnx", "llamacpp", "diskformer"]
    for permutation in itertools.permutations(verdicts):
        assert order(list(permutation)) == expected


def test_nothing_runnable_chooses_nothing() -> None:
    selection = select([refused("a"), refused("b", Refusal.TASK)])
    assert selection.chosen is None and selection.chosen_backend is None
    assert select([]).chosen is None


# ---- through anyformer.load: errors carry every verdict ------------------------------------------


class Answers:
    """A backend plugin that answers ``can_run`` with a fixed verdict and counts the questions."""

    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict
        self.asked = 0

    @hookimpl
    def can_run(self) -> Verdict:
        self.asked += 1
        return self.verdict

    @hookimpl
    def load(self) -> Any:
        return _Handle(self.verdict.backend)


class _Handle(BackendModel):
    task = "text-generation"

    def __init__(self, backend: str) -> None:
        self.backend = backend

    def dispose(self) -> None:
        pass


def _manager(*verdicts: Verdict) -> tuple[PluginManager, dict[str, Answers]]:
    manager = PluginManager()
    plugins = {}
    for verdict in verdicts:
        plugins[verdict.backend] = Answers(verdict)
        manager.register(plugins[verdict.backend], verdict.backend)
    return manager, plugins


def _load(manager: PluginManager, model_description: dict[str, Any], **kwargs: Any) -> anyformer.Loaded:
    return anyformer.load(model_description, caps=Caps(ram_bytes=16 * 2**30), plugins=manager, **kwargs)


def test_load_runs_the_policys_choice(model_description: dict[str, Any]) -> None:
    manager, _ = _manager(ok("llamacpp", Rank.FALLBACK, 80.0), ok("localmind", Rank.SPECIALIST, 20.0), refused("onnx"))
    with _load(manager, model_description) as loaded:
        assert loaded.backend == "localmind"
        assert loaded.verdict is not None and loaded.verdict.backend == "localmind"


def test_load_honours_the_preference_list(model_description: dict[str, Any]) -> None:
    manager, _ = _manager(ok("llamacpp", Rank.FALLBACK), ok("localmind", Rank.SPECIALIST))
    with _load(manager, model_description, prefer="llamacpp") as loaded:
        assert loaded.backend == "llamacpp"


def test_none_ok_raises_no_backend_carrying_every_verdict(model_description: dict[str, Any]) -> None:
    manager, _ = _manager(
        refused("onnx"), refused("localmind", Refusal.GPU), refused("llamacpp", Refusal.BUDGET, need=5)
    )
    with pytest.raises(AnyformerError) as caught:
        _load(manager, model_description)
    error = caught.value
    assert error.code is ErrorCode.NO_BACKEND
    assert sorted(v.backend for v in error.verdicts or []) == ["llamacpp", "localmind", "onnx"]
    assert "onnx says no" in error.message and "localmind says no" in error.message
    assert error.need is None


def test_no_backend_installed_is_no_backend(model_description: dict[str, Any]) -> None:
    with pytest.raises(AnyformerError) as caught:
        _load(PluginManager(), model_description)
    assert caught.value.code is ErrorCode.NO_BACKEND and caught.value.verdicts == []


@pytest.mark.safety("R4")
def test_all_budget_refusals_raise_budget_too_small_with_the_smallest_need(model_description: dict[str, Any]) -> None:
    manager, _ = _manager(
        refused("a", Refusal.BUDGET, need=8 * 10**9),
        refused("b", Refusal.BUDGET, need=3 * 10**9),
        refused("c", Refusal.BUDGET, need=5 * 10**9),
    )
    with pytest.raises(AnyformerError) as caught:
        _load(manager, model_description, budget="1GB")
    assert caught.value.code is ErrorCode.BUDGET_TOO_SMALL
    assert caught.value.need == 3 * 10**9
    assert len(caught.value.verdicts or []) == 3


def test_budget_and_memory_refusals_together_are_no_backend(model_description: dict[str, Any]) -> None:
    manager, _ = _manager(refused("a", Refusal.BUDGET, need=8 * 10**9), refused("b", Refusal.MEMORY, need=2 * 10**9))
    with pytest.raises(AnyformerError) as caught:
        _load(manager, model_description)
    assert caught.value.code is ErrorCode.NO_BACKEND


def test_backend_named_asks_only_that_backend(model_description: dict[str, Any]) -> None:
    manager, plugins = _manager(ok("localmind", Rank.SPECIALIST, 99.0), ok("llamacpp", Rank.FALLBACK))
    with _load(manager, model_description, backend="llamacpp") as loaded:
        assert loaded.backend == "llamacpp"
    assert plugins["localmind"].asked == 0 and plugins["llamacpp"].asked == 1


def test_backend_named_raises_its_own_refusal(model_description: dict[str, Any]) -> None:
    manager, plugins = _manager(ok("localmind", Rank.SPECIALIST), refused("onnx", Refusal.TASK))
    with pytest.raises(AnyformerError) as caught:
        _load(manager, model_description, backend="onnx")
    assert caught.value.code is ErrorCode.NO_BACKEND
    assert [v.to_dict() for v in caught.value.verdicts or []] == [refused("onnx", Refusal.TASK).to_dict()]
    assert plugins["localmind"].asked == 0


@pytest.mark.safety("R4")
def test_backend_named_with_a_budget_refusal_raises_budget_too_small(model_description: dict[str, Any]) -> None:
    manager, _ = _manager(ok("localmind"), refused("onnx", Refusal.BUDGET, need=7 * 10**9))
    with pytest.raises(AnyformerError) as caught:
        _load(manager, model_description, backend="onnx", budget="1GB")
    assert caught.value.code is ErrorCode.BUDGET_TOO_SMALL and caught.value.need == 7 * 10**9


def test_check_with_a_backend_named_returns_only_its_verdict(model_description: dict[str, Any]) -> None:
    manager, _ = _manager(ok("localmind"), refused("onnx"))
    _, selection = anyformer.check(model_description, backend="onnx", caps=Caps(ram_bytes=16 * 2**30), plugins=manager)
    assert [v.backend for v in selection.verdicts] == ["onnx"] and selection.chosen is None


def test_check_and_load_judge_through_one_function(model_description: dict[str, Any], monkeypatch: Any) -> None:
    """What ``check`` says is what ``load`` does: both go through ``_api.judge``, see the same request and
    verdicts, and load runs the backend check chose."""
    from anyformer import _api

    judged: list[_api.Judgement] = []
    real = _api.judge
    monkeypatch.setattr(_api, "judge", lambda *args, **kwargs: judged.append(real(*args, **kwargs)) or judged[-1])
    manager, _ = _manager(ok("llamacpp", Rank.FALLBACK, 80.0), ok("localmind", Rank.SPECIALIST), refused("onnx"))
    asked = {"prefer": "llamacpp", "budget": "2GB", "context": 512}
    _, selection = anyformer.check(model_description, caps=Caps(ram_bytes=16 * 2**30), plugins=manager, **asked)
    with _load(manager, model_description, **asked) as loaded:
        assert selection.chosen is not None and loaded.backend == selection.chosen.backend == "llamacpp"
    checked, loading = judged
    assert checked.request == loading.request and checked.request.budget == 2 * 10**9
    assert checked.verdicts == loading.verdicts and len(checked.verdicts) == 3


# ---- verdict validation (docs/contract.md, "Verdicts") ------------------------------------------------------------


@pytest.mark.parametrize("code", [Refusal.BUDGET, Refusal.MEMORY])
@pytest.mark.parametrize("need", [None, 0, -1])
def test_budget_and_memory_refusals_require_a_positive_need(code: Refusal, need: int | None) -> None:
    with pytest.raises(AnyformerError, match="must carry need") as caught:
        Verdict.refuse("b", code, "too big", need=need)
    assert caught.value.code is ErrorCode.PLUGIN_ERROR


@pytest.mark.parametrize("code", sorted(set(Refusal) - {Refusal.BUDGET, Refusal.MEMORY}))
def test_other_refusals_must_not_carry_need(code: Refusal) -> None:
    with pytest.raises(AnyformerError, match="only budget and memory") as caught:
        Verdict.refuse("b", code, "no", need=10)
    assert caught.value.code is ErrorCode.PLUGIN_ERROR
    assert Verdict.refuse("b", code, "no").need is None


@pytest.mark.parametrize(
    "build",
    [
        lambda: Verdict.refuse("b", "too-slow", "no"),
        lambda: Verdict(backend="b", ok=False, code="FORMAT", reason="no"),  # type: ignore[arg-type]
        lambda: Verdict(backend="b", ok=False, reason="no code at all"),
    ],
    ids=["refuse", "constructor-wrong-case", "missing"],
)
def test_an_unknown_refusal_code_is_rejected(build: Any) -> None:
    with pytest.raises(AnyformerError, match="unknown refusal code") as caught:
        build()
    assert caught.value.code is ErrorCode.PLUGIN_ERROR


def test_refusal_codes_are_accepted_as_their_string_values() -> None:
    verdict = Verdict.refuse("b", "budget", "needs 5 GB", need=5 * 10**9)
    assert verdict.code is Refusal.BUDGET
    assert verdict.to_dict() == {
        "backend": "b",
        "ok": False,
        "code": "budget",
        "reason": "needs 5 GB",
        "need": 5 * 10**9,
    }


def test_an_ok_verdict_carries_no_refusal_code_and_always_an_estimate() -> None:
    with pytest.raises(AnyformerError) as caught:
        Verdict(backend="b", ok=True, code=Refusal.GPU)
    assert caught.value.code is ErrorCode.PLUGIN_ERROR
    assert Verdict(backend="b", ok=True).estimate == Estimate()


@pytest.mark.parametrize("backend", ["", None, 3])
def test_a_verdict_needs_a_backend_id(backend: Any) -> None:
    with pytest.raises(AnyformerError):
        Verdict.accept(backend)


def test_reason_is_one_line() -> None:
    assert Verdict.refuse("b", Refusal.FORMAT, "no GGUF\n  in the\trepo").reason == "no GGUF in the repo"


def test_verdict_json_matches_the_contract() -> None:
    accepted = Verdict.accept("llamacpp", Estimate(ram_bytes=105_000_000, disk_bytes=98_362_432, tok_per_sec=75.0))
    assert accepted.to_dict() == {
        "backend": "llamacpp",
        "ok": True,
        "estimate": {
            "gpu_bytes": 0,
            "ram_bytes": 105_000_000,
            "disk_bytes": 98_362_432,
            "tok_per_sec": 75.0,
            "rank": "general",
        },
    }
