"""A generate option that would change the reply and that the backend does not honour is refused (issue 30)."""

from __future__ import annotations

from typing import Any

import pytest

from anyformer import AnyformerError, Constraint, ErrorCode, GenerateOptions


@pytest.mark.parametrize(
    "option",
    [
        {"min_p": 0.2},
        {"frequency_penalty": 0.5},
        {"presence_penalty": -0.5},
        {"repeat_penalty": 1.1},
        {"logit_bias": {"3": -100}},
        {"constraint": {"type": "regex", "regex": "a+"}},
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"template_variables": {"reasoning_effort": "low"}},
        {"logprobs": 2},
    ],
)
def test_an_option_the_handle_does_not_declare_is_refused_before_any_work(
    load_scripted: Any, option: dict[str, Any]
) -> None:
    loaded, backend = load_scripted([])
    with pytest.raises(AnyformerError) as caught:
        loaded.generate("hi", **option)
    name = next(iter(option))
    assert caught.value.code is ErrorCode.BAD_REQUEST and caught.value.message.startswith(name)
    assert backend.last_options is None, "the backend was called"


def test_values_that_change_nothing_are_not_refused(load_scripted: Any) -> None:
    loaded, backend = load_scripted([])
    list(loaded.generate("hi", frequency_penalty=0, presence_penalty=0.0, repeat_penalty=1, min_p=0, logit_bias={}))
    assert backend.last_options.extra == {}


@pytest.mark.parametrize(
    ("option", "why"),
    [
        ({"min_p": 1.5}, "min_p"),
        ({"repeat_penalty": 0}, "repeat_penalty"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"logit_bias": {"-1": 1}}, "logit_bias"),
        ({"logit_bias": {"1": True}}, "logit_bias"),
        ({"constraint": {"type": "xml"}}, "constraint"),
        ({"constraint": {"type": "regex", "regex": ""}}, "constraint"),
        ({"template_variables": {"messages": []}}, "template variable"),
    ],
)
def test_malformed_sampling_options_are_bad_requests(option: dict[str, Any], why: str) -> None:
    with pytest.raises(AnyformerError) as caught:
        GenerateOptions.build(**option)
    assert caught.value.code is ErrorCode.BAD_REQUEST and caught.value.message.startswith(why)


def test_response_format_shapes_become_one_constraint() -> None:
    schema = {"type": "object", "properties": {"b": {}, "a": {}}}
    openai_shape = Constraint.build({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert openai_shape == Constraint.build({"type": "json_schema", "schema": schema})
    assert list(openai_shape.schema["properties"]) == ["b", "a"], "a schema's property order is kept"
    assert Constraint.build({"type": "json_object"}).schema == {"type": "object"}
    assert Constraint.build(Constraint.build({"type": "gbnf", "gbnf": 'root ::= "x"'}).to_dict()).kind == "gbnf"
