"""The sampling options a backend may honour, each checked and normalised before any work.

They travel in ``GenerateOptions.extra`` under these names. A handle lists the ones it honours in
``honours`` (with the other optional features, :data:`FEATURES`); the core refuses any other
before the backend sees the call, so no option that would change the reply is ever dropped
silently (:mod:`anyformer._honoured`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from anyformer.contract._errors import AnyformerError, ErrorCode

#: Each sampling option and what it does, as llama.cpp defines it (docs/contract.md, "Sampling").
SAMPLING_OPTIONS: dict[str, str] = {
    "top_p": "keep the likeliest tokens whose probabilities add up to top_p (0 < top_p ≤ 1)",
    "top_k": "keep the top_k likeliest tokens; 0 keeps them all (no top-k)",
    "min_p": "drop tokens less likely than min_p times the likeliest one (0 ≤ min_p ≤ 1; 0 is off)",
    "frequency_penalty": "subtract this times a token's count in the reply's last 64 tokens from its logit",
    "presence_penalty": "subtract this from the logit of every token in the reply's last 64 tokens",
    "repeat_penalty": "divide a positive logit (multiply a negative one) of a token in the last 64 by this; 1 is off",
    "logit_bias": "add a bias in [-100, 100] to listed token ids' logits (-100 bans a token)",
}

#: The optional features a handle may also declare in ``honours`` besides the sampling options.
FEATURES: dict[str, str] = {
    "logprobs": "log-probabilities of a chat reply's tokens (raw prompts: every raw_text backend reports them)",
    "constraint": "structured output: the reply is held to a JSON schema, a regex or a grammar",
    "tools": "tool definitions and tool messages reach the chat template",
    "template_variables": "extra chat template variables (reasoning_effort, chat_template_kwargs)",
}

#: The most token ids one ``logit_bias`` may list.
MAX_LOGIT_BIAS = 1024
#: How many of the reply's last tokens the penalties look at (llama.cpp's ``penalty_last_n``).
PENALTY_WINDOW = 64


def _number(extra: Mapping[str, Any], name: str, low: float, high: float, *, open_low: bool = False) -> float | None:
    value = extra.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{name} must be a number, got {value!r:.40}")
    if value < low or value > high or (open_low and value == low):
        bracket = "(" if open_low else "["
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{name} must be in {bracket}{low:g}, {high:g}], got {value!r:.40}")
    return float(value)


def _logit_bias(value: Any) -> dict[int, float]:
    if not isinstance(value, Mapping):
        raise AnyformerError(ErrorCode.BAD_REQUEST, "logit_bias must map token ids to numbers in [-100, 100]")
    if len(value) > MAX_LOGIT_BIAS:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"logit_bias lists {len(value)} tokens; at most {MAX_LOGIT_BIAS}")
    out: dict[int, float] = {}
    for key, bias in value.items():
        token = key if isinstance(key, int) and not isinstance(key, bool) else None
        if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) < 10:
            token = int(key)
        if token is None or token < 0:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"logit_bias: {key!r:.40} is not a token id (an integer ≥ 0)")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"logit_bias[{token}] must be a number in [-100, 100], got {bias!r:.40}"
            )
        out[token] = float(bias)
    return out


#: Values that change nothing: left out, so a backend that lacks the option does not refuse them.
_NEUTRAL: dict[str, float] = {"min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repeat_penalty": 1.0}


def normalised_sampling(extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` with the sampling options past ``top_p``/``top_k`` checked, and ``logit_bias``'s keys as ints.

    ``BAD_REQUEST`` names the first malformed option. Options given as None, and values that change
    nothing (``frequency_penalty=0``, ``repeat_penalty=1``, ``min_p=0``, an empty ``logit_bias``), are left out.
    """
    out = {name: value for name, value in extra.items() if not (name in SAMPLING_OPTIONS and value is None)}
    for name, low, high, open_low in (
        ("min_p", 0.0, 1.0, False),
        ("frequency_penalty", -2.0, 2.0, False),
        ("presence_penalty", -2.0, 2.0, False),
        ("repeat_penalty", 0.0, 10.0, True),
    ):
        value = _number(out, name, low, high, open_low=open_low)
        if value == _NEUTRAL[name]:
            out.pop(name, None)
        elif value is not None:
            out[name] = value
    if "logit_bias" in out:
        out["logit_bias"] = _logit_bias(out["logit_bias"])
        if not out["logit_bias"]:
            del out["logit_bias"]
    return out
