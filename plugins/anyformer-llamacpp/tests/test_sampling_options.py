"""llama.cpp honours every sampling option, constraints, tools and template variables (issue 30).

The sampler is checked against numpy written out from llama.cpp's definitions; the options are
checked end to end on the embedded SmolLM2 and the tiny random llama.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tiny_gguf import write_tiny_llama

import anyformer
from anyformer import AnyformerError, ErrorCode, GenerateOptions
from anyformer_llamacpp.sampling import Sampler

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _logits(seed: int = 0, size: int = 50) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, size).astype(np.float32)


def test_logit_bias_and_penalties_change_the_logits_as_llama_cpp_defines_them() -> None:
    logits = _logits()
    options = GenerateOptions.build(
        logit_bias={"3": -100, 7: 5}, repeat_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.25
    )
    sampler = Sampler(options, len(logits))
    for token in (1, 1, 2):
        sampler.accept(token)
    expected = logits.astype(np.float64).copy()
    expected[3] -= 100
    expected[7] += 5
    for token, count in ((1, 2), (2, 1)):
        value = expected[token]
        value = value / 1.3 if value > 0 else value * 1.3
        expected[token] = value - count * 0.5 - 0.25
    assert sampler.choose(logits) == int(expected.argmax())
    # The sampler works on a copy: the engine's logits are never written.
    assert np.array_equal(logits, _logits())
    banned = Sampler(GenerateOptions.build(logit_bias={str(int(logits.argmax())): -100}), len(logits))
    assert banned.choose(logits) == int(np.argsort(-logits)[1])


def test_top_k_zero_keeps_every_token_where_top_k_one_would_be_greedy() -> None:
    logits = np.zeros(8, dtype=np.float32)  # every token equally likely
    drawn = {
        Sampler(GenerateOptions.build(temperature=1.0, top_k=0, top_p=1.0, seed=s), 8).choose(logits) for s in range(64)
    }
    assert len(drawn) >= 6, f"top_k=0 drew only {sorted(drawn)} of 8 equally likely tokens"
    greedy = {
        Sampler(GenerateOptions.build(temperature=1.0, top_k=1, seed=s), 8).choose(_logits(1, 8)) for s in range(16)
    }
    assert greedy == {int(_logits(1, 8).argmax())}


def test_min_p_drops_tokens_less_likely_than_its_share_of_the_likeliest() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    options = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.4)
    drawn = {Sampler(GenerateOptions.build(seed=s, **options), 4).choose(logits) for s in range(200)}
    assert drawn == {0, 1}, f"min_p=0.4 keeps p >= 0.2 (tokens 0 and 1), drew {sorted(drawn)}"


def test_a_logit_bias_token_outside_the_vocabulary_is_refused(smollm2: anyformer.Loaded) -> None:
    with pytest.raises(AnyformerError) as caught:
        list(smollm2.generate(QUESTION, max_new_tokens=2, logit_bias={"999999": -100}))
    assert caught.value.code is ErrorCode.BAD_REQUEST and "999999" in caught.value.message


def test_sampling_options_change_smollm2_replies(smollm2: anyformer.Loaded) -> None:
    greedy = smollm2.complete(QUESTION, max_new_tokens=24).text
    first = smollm2.handle._llama.tokenize(greedy.encode(), add_bos=False, special=False)[0]
    assert smollm2.complete(QUESTION, max_new_tokens=24, logit_bias={first: -100}).text != greedy
    for penalty in ({"repeat_penalty": 1.5}, {"frequency_penalty": 1.5}, {"presence_penalty": 1.5}):
        assert smollm2.complete(QUESTION, max_new_tokens=24, **penalty).text != greedy, penalty
    # min_p=1 keeps only the likeliest token: sampling at temperature 1 is then greedy.
    assert smollm2.complete(QUESTION, max_new_tokens=24, temperature=1.0, min_p=1.0, seed=5).text == greedy
    varied = {smollm2.complete(QUESTION, max_new_tokens=12, temperature=1.0, top_k=0, seed=s).text for s in range(4)}
    assert len(varied) >= 2, varied
    again = smollm2.complete(QUESTION, max_new_tokens=12, temperature=1.0, top_k=0, seed=3).text
    assert again == smollm2.complete(QUESTION, max_new_tokens=12, temperature=1.0, top_k=0, seed=3).text


def test_chat_logprobs_are_the_greedy_choice_and_its_alternatives(smollm2: anyformer.Loaded) -> None:
    chunks = list(smollm2.generate(QUESTION, max_new_tokens=6, logprobs=3))
    entries = [entry for chunk in chunks for entry in chunk.logprobs]
    assert len(entries) == chunks[-1].tokens
    assert "".join(entry.token for entry in entries) == chunks[-1].text
    for entry in entries:
        assert entry.top[0][0] == entry.token and entry.top[0][1] == pytest.approx(entry.logprob)
        assert len(entry.top) == 3 and entry.logprob <= 0


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "role": {"type": "string", "enum": ["pilot", "doctor", "teacher"]},
        "retired": {"type": "boolean"},
    },
    "required": ["name", "role", "retired"],
    "additionalProperties": False,
}


def test_a_json_schema_constraint_gives_valid_json_on_every_prompt(smollm2: anyformer.Loaded) -> None:
    for prompt in ("Describe a pilot.", "Invent a doctor.", "Who teaches you?"):
        last = smollm2.complete(
            [{"role": "user", "content": prompt}],
            max_new_tokens=80,
            constraint={"type": "json_schema", "schema": PERSON},
        )
        value = json.loads(last.text)
        assert set(value) == {"name", "role", "retired"} and value["role"] in ("pilot", "doctor", "teacher")
        assert isinstance(value["name"], str) and isinstance(value["retired"], bool)
        assert last.finish_reason == "stop"


def test_regex_lark_and_gbnf_constraints_hold_the_reply(smollm2: anyformer.Loaded) -> None:
    regex = smollm2.complete(QUESTION, max_new_tokens=20, constraint={"type": "regex", "regex": "[A-Z][a-z]{2,8}!"})
    assert re.fullmatch("[A-Z][a-z]{2,8}!", regex.text), regex.text
    lark = smollm2.complete(QUESTION, max_new_tokens=20, constraint={"type": "lark", "lark": 'start: "yes" | "no"'})
    assert lark.text in ("yes", "no")
    gbnf = smollm2.complete(
        QUESTION, max_new_tokens=20, constraint={"type": "gbnf", "gbnf": 'root ::= "Paris" | "Lyon"'}
    )
    assert gbnf.text in ("Paris", "Lyon")


def test_a_constraint_that_does_not_compile_is_refused_before_streaming(smollm2: anyformer.Loaded) -> None:
    with pytest.raises(AnyformerError) as caught:
        smollm2.generate(QUESTION, constraint={"type": "lark", "lark": "start: undefined_rule"})
    assert caught.value.code is ErrorCode.BAD_REQUEST and "constraint" in caught.value.message


WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 30},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    }
]


def test_a_named_tool_choice_yields_a_valid_call_even_on_a_template_without_tools(smollm2: anyformer.Loaded) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    with pytest.raises(AnyformerError) as caught:
        smollm2.generate(ask, tools=WEATHER)  # tool_choice auto: SmolLM2's template never shows the tools
    assert caught.value.code is ErrorCode.BAD_REQUEST and "does not render tools" in caught.value.message
    last = smollm2.complete(ask, tools=WEATHER, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert last.finish_reason == "tool_calls" and len(last.tool_calls) == 1
    call = last.tool_calls[0]
    arguments = json.loads(call.arguments)
    assert call.name == "get_weather" and set(arguments) == {"city", "unit"}
    assert arguments["unit"] in ("celsius", "fahrenheit") and isinstance(arguments["city"], str)
    plain = smollm2.complete(ask, tools=WEATHER, tool_choice="none", max_new_tokens=8)
    assert plain.tool_calls == () and plain.finish_reason in ("stop", "length")


VARIABLES_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for call in m.tool_calls or [] %}CALL {{ call.function.name }} "
    "{{ call.function.arguments | tojson }}{% endfor %}"
    "{% if m.tool_call_id is defined %} for {{ m.tool_call_id }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if tools %}TOOLS {% for tool in tools %}{{ tool.function.name }}{% endfor %}\n{% endif %}"
    "{% if reasoning_effort is defined %}EFFORT {{ reasoning_effort }}\n{% endif %}"
    "{% if enable_thinking %}THINK\n{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def variables_llama(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = write_tiny_llama(tmp_path_factory.mktemp("vars") / "vars-llama-F32.gguf", chat_template=VARIABLES_TEMPLATE)
    with anyformer.load(path, backend="llamacpp") as loaded:
        yield loaded


def _rendered(loaded: anyformer.Loaded, messages: list[dict[str, Any]], **options: Any) -> str:
    built = GenerateOptions.build(**options)
    checked = anyformer.validate_messages(messages)
    prompt, _ = loaded.handle._render(checked, built.thinking, built)
    return prompt


def test_tools_tool_messages_and_template_variables_reach_the_template(variables_llama: anyformer.Loaded) -> None:
    history = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3 C"},
    ]
    prompt = _rendered(
        variables_llama, history, tools=WEATHER, template_variables={"reasoning_effort": "high"}, thinking=True
    )
    assert 'CALL get_weather {"city": "Oslo"}' in prompt and "3 C for c1" in prompt
    assert "TOOLS get_weather" in prompt and "EFFORT high" in prompt and "THINK" in prompt
    bare = _rendered(variables_llama, history[:1])
    assert "TOOLS" not in bare and "EFFORT" not in bare and "THINK" not in bare
    # tool_choice none renders no tools.
    assert "TOOLS" not in _rendered(variables_llama, history[:1], tools=WEATHER, tool_choice="none")


def test_a_parallel_model_honours_the_same_options(tmp_path: Path, smollm2: anyformer.Loaded) -> None:
    greedy = smollm2.complete(QUESTION, max_new_tokens=16).text
    first = smollm2.handle._llama.tokenize(greedy.encode(), add_bos=False, special=False)[0]
    with anyformer.load(anyformer.default_model_path(), backend="llamacpp", options={"parallel": 2}) as parallel:
        assert parallel.complete(QUESTION, max_new_tokens=16).text == greedy
        assert parallel.complete(QUESTION, max_new_tokens=16, logit_bias={first: -100}).text != greedy
        value = json.loads(
            parallel.complete(QUESTION, max_new_tokens=80, constraint={"type": "json_schema", "schema": PERSON}).text
        )
        assert value["role"] in ("pilot", "doctor", "teacher")


def test_an_isolated_worker_carries_constraints_tools_and_sampling(
    smollm2: anyformer.Loaded, smollm2_path: Path
) -> None:
    greedy = smollm2.complete(QUESTION, max_new_tokens=12, repeat_penalty=1.5).text
    with anyformer.load(smollm2_path, backend="llamacpp", context=2048, isolate=True) as isolated:
        assert isolated.isolated and isolated.honours == smollm2.honours
        assert isolated.complete(QUESTION, max_new_tokens=12, repeat_penalty=1.5).text == greedy
        called = isolated.complete(QUESTION, tools=WEATHER, tool_choice="required", max_new_tokens=60)
        assert called.finish_reason == "tool_calls" and called.tool_calls[0].name == "get_weather"
        held = isolated.complete(QUESTION, max_new_tokens=8, constraint={"type": "regex", "regex": "(yes|no)"})
        assert held.text in ("yes", "no")
