"""What agents send, through the real ``openai`` client on the embedded SmolLM2 (issue 30), streamed and not."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from anyformer.server import ModelPool, create_app  # noqa: E402

from .conftest import REPO_ROOT  # noqa: E402
from .server_support import serve_in_thread  # noqa: E402

pytestmark = pytest.mark.slow

CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "country": {"type": "string", "maxLength": 30},
        "capital": {"type": "boolean"},
        "size": {"enum": ["small", "medium", "large"]},
    },
    "required": ["city", "country", "capital", "size"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


def client_for(real_server: tuple[str, Any]) -> Any:
    url, _pool = real_server
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def streamed(client: Any, **request: Any) -> tuple[str, str | None, list[Any], str]:
    """A streamed reply's content, finish reason, tool call deltas and reasoning."""
    text, reasoning, finish, calls = "", "", None, []
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
            calls.extend(choice.delta.tool_calls or [])
            finish = choice.finish_reason or finish
    return text, finish, calls, reasoning


def valid_city(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == {"city", "country", "capital", "size"}
        and isinstance(value["city"], str)
        and isinstance(value["country"], str)
        and isinstance(value["capital"], bool)
        and value["size"] in ("small", "medium", "large")
    )


def test_a_json_schema_reply_parses_and_validates_on_every_prompt(
    real_server: tuple[str, Any], smollm2_path: Path
) -> None:
    client = client_for(real_server)
    response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    for prompt in ("Tell me about Paris.", "Describe a city you like.", "Where is Tokyo?"):
        request = dict(model=str(smollm2_path), messages=ask(prompt), max_tokens=120, response_format=response_format)
        whole = client.chat.completions.create(**request)
        assert valid_city(json.loads(whole.choices[0].message.content)), whole.choices[0].message.content
        text, finish, _, _ = streamed(client, **request)
        assert text == whole.choices[0].message.content and finish == "stop"
    loose = client.chat.completions.create(
        model=str(smollm2_path), messages=ask("Hi"), max_tokens=60, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(loose.choices[0].message.content), dict)


def test_a_named_tool_choice_yields_a_valid_get_weather_call(real_server: tuple[str, Any], smollm2_path: Path) -> None:
    client = client_for(real_server)
    request = dict(
        model=str(smollm2_path),
        messages=ask("What is the weather like in Paris?"),
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=80,
    )
    whole = client.chat.completions.create(**request).choices[0]
    assert whole.finish_reason == "tool_calls" and len(whole.message.tool_calls) == 1
    call = whole.message.tool_calls[0]
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and set(arguments) == {"city", "unit"}
    assert arguments["unit"] in ("celsius", "fahrenheit") and call.id.startswith("call_")
    text, finish, deltas, _ = streamed(client, **request)
    # As OpenAI streams a call: the first delta has index, id, type and name; the arguments follow in fragments.
    first, rest = deltas[0], deltas[1:]
    assert (first.index, first.type, first.function.name) == (0, "function", "get_weather")
    assert first.id.startswith("call_") and all(d.index == 0 and d.id is None and d.function.name is None for d in rest)
    assert len(rest) >= 3, "the arguments come as they are decoded, not in one delta at the end"
    added = (first.function.arguments or "") + "".join(d.function.arguments or "" for d in rest)
    assert (text, finish, added) == ("", "tool_calls", call.function.arguments)  # greedy: the same call, streamed
    # tools with tool_choice auto on a template that cannot show them: a 400 saying so.
    with pytest.raises(openai.BadRequestError, match="does not render tools"):
        client.chat.completions.create(model=str(smollm2_path), messages=ask("Hi"), tools=[WEATHER], max_tokens=4)
    plain = client.chat.completions.create(
        model=str(smollm2_path), messages=ask("Hi"), tools=[WEATHER], tool_choice="none", max_tokens=4
    )
    assert plain.choices[0].message.tool_calls is None


def test_logit_bias_top_k_zero_and_penalties_change_the_reply(real_server: tuple[str, Any], smollm2_path: Path) -> None:
    client = client_for(real_server)
    # A reply that repeats itself within 24 tokens, so every penalty has something to change.
    base = dict(model=str(smollm2_path), messages=ask("What is the capital of France?"), max_tokens=24, temperature=0)
    greedy = client.chat.completions.create(logprobs=True, **base).choices[0]
    first = greedy.logprobs.content[0].token
    import anyformer

    with anyformer.load(smollm2_path, backend="llamacpp") as local:
        token_id = local.handle._llama.tokenize(first.encode(), add_bos=False, special=False)[0]
    biased = client.chat.completions.create(logit_bias={str(token_id): -100}, **base).choices[0]
    assert not biased.message.content.startswith(first), (first, biased.message.content)
    assert streamed(client, logit_bias={str(token_id): -100}, **base)[0] == biased.message.content
    for penalty in ({"frequency_penalty": 1.5}, {"presence_penalty": 1.5}, {"extra_body": {"repeat_penalty": 1.5}}):
        changed = client.chat.completions.create(**penalty, **base).choices[0].message.content
        assert changed != greedy.message.content, penalty
    sampled = dict(base, temperature=1.0, extra_body={"top_k": 0})
    replies = [client.chat.completions.create(seed=seed, **sampled).choices[0].message.content for seed in (1, 2, 3)]
    assert len(set(replies)) >= 2, replies
    assert client.chat.completions.create(seed=2, **sampled).choices[0].message.content == replies[1]
    # min_p=1 keeps only the likeliest token: at temperature 1 the reply is the greedy one.
    only_best = client.chat.completions.create(seed=4, **dict(base, temperature=1.0, extra_body={"min_p": 1.0}))
    assert only_best.choices[0].message.content == greedy.message.content


def test_chat_logprobs_streamed_and_whole(real_server: tuple[str, Any], smollm2_path: Path) -> None:
    client = client_for(real_server)
    request = dict(model=str(smollm2_path), messages=ask("Hi"), max_tokens=6, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**request)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    assert "".join(entry.token for entry in content) == whole.choices[0].message.content
    assert all(len(entry.top_logprobs) == 2 and entry.top_logprobs[0].token == entry.token for entry in content)
    tokens = []
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            tokens.extend(entry.token for entry in (choice.logprobs.content if choice.logprobs else []))
    assert tokens == [entry.token for entry in content]


def test_reasoning_is_split_out_streamed_and_not(real_server: tuple[str, Any], smollm2_path: Path) -> None:
    client = client_for(real_server)
    # A regex makes SmolLM2 (which never thinks) write a <think> block, so the split can be seen on a real reply.
    request = dict(
        model=str(smollm2_path),
        messages=ask("Is the sky blue?"),
        max_tokens=40,
        reasoning_effort="low",
        extra_body={"response_format": {"type": "regex", "regex": "<think>[a-z ]{3,20}</think>(Yes|No)"}},
    )
    whole = client.chat.completions.create(**request).choices[0].message
    assert whole.content in ("Yes", "No") and re.fullmatch("[a-z ]{3,20}", whole.model_extra["reasoning_content"])
    text, _, _, reasoning = streamed(client, **request)
    assert (text, reasoning) == (whole.content, whole.model_extra["reasoning_content"])


def test_unknown_fields_are_refused_and_unused_ones_accepted(real_server: tuple[str, Any], smollm2_path: Path) -> None:
    client = client_for(real_server)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=str(smollm2_path), messages=ask("Hi"), extra_body={"mirostat": 2})
    assert caught.value.body["param"] == "mirostat"
    reply = client.chat.completions.create(
        model=str(smollm2_path), messages=ask("Hi"), max_tokens=2, user="me", metadata={"a": "b"}, store=False
    )
    assert reply.choices[0].message.content is not None


#: A template that opens ``<think>`` in the prompt when thinking is on (Qwen3's later templates, QwQ, DeepSeek-R1).
OPENS_THINK = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}"
)


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A server with a tiny random llama whose template opens <think> in the prompt."""
    pytest.importorskip("anyformer_llamacpp")
    sys.path.insert(0, str(REPO_ROOT / "plugins" / "anyformer-llamacpp" / "tests"))
    try:
        from tiny_gguf import write_tiny_llama
    finally:
        sys.path.pop(0)
    path = write_tiny_llama(tmp_path_factory.mktemp("opens-think") / "opens-think-F32.gguf", chat_template=OPENS_THINK)
    with serve_in_thread(create_app(ModelPool(context=512), models=[str(path)])) as url:
        yield url, path


def test_a_reply_that_began_inside_its_reasoning_is_split_streamed_and_not(
    thinking_server: tuple[str, Path],
) -> None:
    url, path = thinking_server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    # The reply never writes <think> (the prompt did): a regex holds the random model to reasoning, </think>, an answer.
    request = dict(
        model=str(path),
        messages=ask("Is the sky blue?"),
        max_tokens=40,
        reasoning_effort="low",
        extra_body={"response_format": {"type": "regex", "regex": "[a-z ]{3,12}</think>(Yes|No)"}},
    )
    whole = client.chat.completions.create(**request).choices[0].message
    assert whole.content in ("Yes", "No") and re.fullmatch("[a-z ]{3,12}", whole.model_extra["reasoning_content"])
    text, _, _, reasoning = streamed(client, **request)
    assert (text, reasoning) == (whole.content, whole.model_extra["reasoning_content"])
    # Thinking off: the template opens nothing, so the same text is all content.
    off = dict(request, reasoning_effort="none")
    plain = client.chat.completions.create(**off).choices[0].message
    assert "</think>" in plain.content and not plain.model_extra.get("reasoning_content")
