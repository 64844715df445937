"""The core holds plugins to the contract: needs above the offer, own ids, wrapped errors."""

from __future__ import annotations

from typing import Any

import pytest

import anyformer
from anyformer import AnyformerError, Caps, ErrorCode, Refusal, Request, StoreEntry, Verdict, hookimpl
from anyformer.plugin import BackendModel


class _Refuser:
    def __init__(self, code: Refusal, need: int) -> None:
        self.code, self.need = code, need

    @hookimpl
    def can_run(self, model: Any) -> Verdict:
        return Verdict.refuse("refuser", self.code, "too big", need=self.need)


def _verdicts(plugin: Any, caps: Caps, request: Request) -> list[Verdict]:
    manager = anyformer.PluginManager()
    manager.register(plugin, "refuser")
    return manager.can_run(anyformer.Model(repo="x"), caps, request)


@pytest.mark.parametrize(
    ("code", "need", "ok_need"),
    [(Refusal.BUDGET, 10**9, 10**9 + 1), (Refusal.MEMORY, 2 * 10**9, 2 * 10**9 + 1)],
)
def test_a_need_not_above_the_offer_is_a_plugin_error(code: Refusal, need: int, ok_need: int) -> None:
    caps, request = Caps(ram_bytes=2 * 10**9), Request(budget=10**9)
    [bad] = _verdicts(_Refuser(code, need), caps, request)
    assert bad.code is Refusal.RUNTIME and "need" in bad.reason
    [good] = _verdicts(_Refuser(code, ok_need), caps, request)
    assert good.code is code and good.need == ok_need


def test_an_ok_verdict_with_a_need_is_refused_at_construction() -> None:
    with pytest.raises(AnyformerError) as info:
        Verdict(backend="x", ok=True, need=5)
    assert info.value.code is ErrorCode.PLUGIN_ERROR


class _RaisingGenerate:
    class Handle(BackendModel):
        backend = "raiser"
        task = "text-generation"

        def generate(self, messages: Any, options: Any) -> Any:
            raise ValueError("no KV slot")

        def dispose(self) -> None:
            pass

    @hookimpl
    def can_run(self, model: Any) -> Verdict:
        return Verdict.accept("raiser")

    @hookimpl
    def load(self) -> Any:
        return self.Handle()

    @hookimpl
    def store_list(self) -> list[StoreEntry]:
        return [StoreEntry(backend="someone-else", repo="r", revision=None, path="/x", bytes=1)]


def test_generate_raising_before_streaming_is_plugin_error_and_frees_the_model() -> None:
    manager = anyformer.PluginManager()
    manager.register(_RaisingGenerate(), "raiser")
    with anyformer.load({"repo": "x"}, caps=Caps(ram_bytes=16 * 2**30), plugins=manager) as loaded:
        for _ in range(2):  # the second call proves the BUSY lock was released
            with pytest.raises(AnyformerError) as info:
                loaded.generate("hi")
            assert info.value.code is ErrorCode.PLUGIN_ERROR and "no KV slot" in info.value.message


def test_store_entries_for_another_backend_id_are_reported_not_listed() -> None:
    manager = anyformer.PluginManager()
    manager.register(_RaisingGenerate(), "raiser")
    entries, problems = manager.store_list()
    assert entries == [] and problems and "someone-else" in problems[0]
