"""diskformer's load options reach the engine parsed by the core's schema (text as the CLI sends it)."""

from __future__ import annotations

import pytest

import anyformer
from anyformer import AnyformerError, ErrorCode
from anyformer.plugin import read_gguf_header
from anyformer_diskformer.cache import policies
from anyformer_diskformer.cache.expert_reader import DirectExpertReader
from anyformer_diskformer.engines.gpu import layout
from anyformer_diskformer.option_schema import LOAD_OPTIONS
from anyformer_diskformer.plan import plan_from_header


def test_the_schema_s_choices_and_defaults_are_the_engine_s() -> None:
    assert {o.name: o for o in LOAD_OPTIONS}["cache_policy"].choices == policies.POLICY_NAMES
    assert LOAD_OPTIONS.value({}, "prompt_step") == layout.PROMPT_STEP
    assert anyformer.get_plugin_manager().load_options("diskformer") is LOAD_OPTIONS


def test_text_options_reach_the_cpu_engine_as_their_types(moe_f32: str) -> None:
    slots = plan_from_header(read_gguf_header(moe_f32), 64).min_cache_bytes
    options = {"device": "cpu", "pool_bytes": str(slots), "cache_policy": "lru", "prefetch": "0", "direct_io": "no"}
    with anyformer.load(moe_f32, backend="diskformer", context=64, options=options) as loaded:
        cache = loaded.handle.engine.cache
        assert cache.capacity_bytes == slots
        assert type(cache.policy).__name__ == "LRU"
        assert loaded.handle.prefetch_width == 0
        assert not isinstance(cache.reader, DirectExpertReader)


@pytest.mark.parametrize(
    ("options", "named"),
    [({"device": "tpu"}, "'device'"), ({"pool_bytes": "lots"}, "'pool_bytes'"), ({"prompt_step": 0}, "'prompt_step'")],
)
def test_a_bad_option_is_bad_request_before_anything_loads(moe_f32: str, options: dict, named: str) -> None:
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(moe_f32, backend="diskformer", options=options)
    assert caught.value.code is ErrorCode.BAD_REQUEST and named in caught.value.message
