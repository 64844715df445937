"""``anyformer run``'s sampling and structured-output flags become ``generate`` options, checked before a load."""

from __future__ import annotations

import pytest

from anyformer import AnyformerError, ErrorCode
from anyformer.cli._main import build_parser, join_negative_values
from anyformer.cli._run_cmd import _check_options
from anyformer.cli._sampling_args import sampling_options


def parse(*flags: str) -> object:
    return build_parser().parse_args(join_negative_values(["run", "default", "hi", *flags]))


def test_each_flag_becomes_its_option() -> None:
    args = parse(
        "--top-k", "0", "--min-p", "0.1", "--repeat-penalty", "1.2", "--frequency-penalty", "0.5",
        "--presence-penalty", "0.25", "--top-p", "0.9", "--logit-bias", "5=-100", "--logit-bias", "7=2",
        "--json-schema", '{"type": "object"}',
    )  # fmt: skip
    assert sampling_options(args) == {  # type: ignore[arg-type]
        "top_p": 0.9,
        "top_k": 0,
        "min_p": 0.1,
        "repeat_penalty": 1.2,
        "frequency_penalty": 0.5,
        "presence_penalty": 0.25,
        "logit_bias": {"5": -100.0, "7": 2.0},
        "constraint": {"type": "json_schema", "schema": {"type": "object"}},
    }
    assert sampling_options(parse()) == {}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "flags",
    [("--min-p", "3"), ("--logit-bias", "5"), ("--json-schema", "{nope"), ("--regex", "a", "--json-schema", "{}")],
)
def test_a_bad_flag_is_refused_before_the_model_loads(flags: tuple[str, ...]) -> None:
    with pytest.raises(AnyformerError) as caught:
        _check_options(parse(*flags))  # type: ignore[arg-type]
    assert caught.value.code is ErrorCode.BAD_REQUEST
