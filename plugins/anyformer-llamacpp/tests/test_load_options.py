"""The llama.cpp backend's load options reach the engine parsed by the core's schema (text as the CLI sends it)."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import pytest

import anyformer
from anyformer import AnyformerError, ErrorCode
from anyformer_llamacpp.load_options import LOAD_OPTIONS
from anyformer_llamacpp.plugin import LOAD_OPTIONS as DECLARED


def test_the_plugin_module_declares_the_schema_the_core_reads() -> None:
    assert DECLARED is LOAD_OPTIONS
    assert anyformer.get_plugin_manager().load_options("llamacpp") is LOAD_OPTIONS


def test_text_options_reach_llama_cpp_as_their_types(smollm2_path: Path) -> None:
    options = {"threads": "1", "flash_attention": "off", "special_in_content": "yes"}
    with anyformer.load(smollm2_path, backend="llamacpp", context=256, options=options) as loaded:
        llama = loaded.handle._llama
        assert llama.n_threads == 1 and llama.n_threads_batch == 1
        assert llama.context_params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        assert loaded.handle.special_in_content is True
    with anyformer.load(smollm2_path, backend="llamacpp", context=256, options={"threads": 2}) as loaded:
        assert loaded.handle._llama.context_params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        assert loaded.handle.special_in_content is False


@pytest.mark.parametrize(
    ("options", "named"),
    [({"threads": "two"}, "'threads'"), ({"flash_attention": "maybe"}, "'flash_attention'"), ({"n_gpu": 3}, "'n_gpu'")],
)
def test_a_bad_option_is_bad_request_before_anything_loads(smollm2_path: Path, options: dict, named: str) -> None:
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(smollm2_path, backend="llamacpp", options=options)
    assert caught.value.code is ErrorCode.BAD_REQUEST and named in caught.value.message
