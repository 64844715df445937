"""The next constraint mask computed while llama_decode runs (constraint.MaskAhead): the same reply as in line,
used only where a core is free for it, and no thread left after dispose."""

from __future__ import annotations

import json
import threading

import pytest

import anyformer

PROMPT = [{"role": "user", "content": "Describe a lighthouse keeper."}]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer"},
        "kind": {"type": "boolean"},
    },
    "required": ["name", "age", "kind"],
    "additionalProperties": False,
}


def _mask_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("anyformer-mask")]


@pytest.mark.slow
def test_a_mask_computed_ahead_gives_the_reply_computed_in_line() -> None:
    constraint = {"type": "json_schema", "schema": SCHEMA}
    with anyformer.load(
        anyformer.default_model_path(), backend="llamacpp", isolate=False, options={"threads": 1}
    ) as loaded:
        handle = loaded.handle
        handle.mask_ahead.spare_core = True  # one decode thread: wherever there are two cores, one is free
        ahead = loaded.complete(PROMPT, max_new_tokens=64, constraint=constraint)
        assert _mask_threads(), "the mask was not computed on the model's mask thread"
        handle.mask_ahead.spare_core = False
        in_line = loaded.complete(PROMPT, max_new_tokens=64, constraint=constraint)
    assert ahead.text == in_line.text and ahead.tokens == in_line.tokens
    value = json.loads(ahead.text)
    assert set(value) == {"name", "age", "kind"}
    assert not _mask_threads(), "dispose left the mask thread running"


def test_the_mask_is_computed_in_line_where_the_decode_threads_take_every_core() -> None:
    from anyformer.plugin import usable_cpu_count

    with anyformer.load(
        anyformer.default_model_path(), backend="llamacpp", isolate=False, options={"threads": usable_cpu_count()}
    ) as loaded:
        assert loaded.handle.mask_ahead.spare_core is (loaded.handle.gpu_layers > 0)
        assert loaded.handle.mask_ahead.executor() is None or loaded.handle.gpu_layers > 0
