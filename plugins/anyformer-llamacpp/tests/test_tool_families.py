"""llama.cpp holds a forced call to the syntax of its template's family, and says when the prompt opened ``<think>``.

Each template below carries one family's markers the way the real templates do (Qwen/Hermes,
Granite 3, Phi-4-mini, Mistral, Mistral v11, Llama 3.x, Gemma 3); the tiny random llama then must
write a named call in that syntax, and the core reads it back as a valid call.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_gguf import write_tiny_llama

import anyformer

#: The tools as the test templates list them: by name only (the byte vocabulary spends a token a character).
LISTED = "{{ tools | map(attribute='function.name') | join(',') }}"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Each family's markers, as a line its real template writes, before a ChatML body (so the tiny vocabulary renders it).
FAMILIES = {
    "hermes": (
        "{% if tools %}<tools>" + LISTED + "</tools> <tool_call></tool_call>{% endif %}",
        "<tool_call>\n{",
    ),
    "granite": (
        "{% if tools %}<|start_of_role|>tools" + LISTED + "<|tool_call|>{% endif %}",
        "<|tool_call|>[{",
    ),
    "phi": (
        "{% if tools %}<|tool|>" + LISTED + "<|/tool|>{% endif %}",
        "functools[{",
    ),
    "mistral": (
        "{% if tools %}[AVAILABLE_TOOLS]" + LISTED + "[TOOL_CALLS]{% endif %}",
        "[TOOL_CALLS][{",
    ),
    "mistral-v11": (
        "{% if tools %}[AVAILABLE_TOOLS]" + LISTED + "[TOOL_CALLS][ARGS]{% endif %}",
        "[TOOL_CALLS]get_",
    ),
    "llama3": (
        "<|start_header_id|>{% if tools %}" + LISTED + "<|python_tag|>{% endif %}",
        '{"name": "get_',
    ),
    "gemma3": ("<start_of_turn>", '{"name": "get_'),
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Rome"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 9},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def family_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("families")
    return {
        name: write_tiny_llama(folder / f"{name}-F32.gguf", chat_template=markers + CHATML, context=2048)
        for name, (markers, _) in FAMILIES.items()
    }


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_named_call_is_written_in_the_family_syntax_and_read_back(
    family: str, family_models: dict[str, Path]
) -> None:
    with anyformer.load(family_models[family], backend="llamacpp") as loaded:
        for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
            tools = [WEATHER] if choice != "required" else [WEATHER, TIME]
            last = loaded.complete(ASK, tools=tools, tool_choice=choice, max_new_tokens=120)
            assert last.text.startswith(FAMILIES[family][1]), f"{family}: {last.text!r}"
            assert last.finish_reason == "tool_calls" and len(last.tool_calls) == 1, f"{family}: {last.text!r}"
            call = last.tool_calls[0]
            if choice != "required":
                arguments = json.loads(call.arguments)
                assert call.name == "get_weather" and arguments["city"] in ("Paris", "Rome")
                assert 1 <= arguments["days"] <= 9 and set(arguments) == {"city", "days"}
            else:
                assert call.name in ("get_weather", "get_time")


def test_gemma4_writes_a_forced_call_in_its_own_values(tmp_path: Path) -> None:
    template = "{% if tools %}<|tool>" + LISTED + "<tool|><|tool_call>call:<tool_call|>{% endif %}" + CHATML
    path = write_tiny_llama(tmp_path / "gemma4-F32.gguf", chat_template=template, context=2048)
    lookup = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"enum": ["Paris", "Rome"]},
                    "exact": {"type": "boolean"},
                    "note": {"type": "string", "maxLength": 6},
                },
            },
        },
    }
    with anyformer.load(path, backend="llamacpp") as loaded:
        last = loaded.complete(ASK, tools=[lookup], tool_choice="required", max_new_tokens=120)
    assert last.text.startswith('<|tool_call>call:get_weather{city:<|"|>'), last.text
    assert last.finish_reason == "tool_calls", last.text
    arguments = json.loads(last.tool_calls[0].arguments)
    assert arguments["city"] in ("Paris", "Rome") and isinstance(arguments["exact"], bool)
    assert isinstance(arguments["note"], str) and len(arguments["note"]) <= 6


def test_gemma3_takes_tools_with_auto_by_google_s_convention(family_models: dict[str, Path]) -> None:
    with anyformer.load(family_models["gemma3"], backend="llamacpp") as loaded:
        prompt = loaded.handle.prompt_with_marks(  # type: ignore[attr-defined]
            ASK, False, anyformer.GenerateOptions.build(tools=[WEATHER])
        )[0]
        text = loaded.handle._llama.detokenize(prompt).decode()  # type: ignore[attr-defined]
        assert "You have access to functions" in text and '"get_weather"' in text
        assert loaded.complete(ASK, tools=[WEATHER], max_new_tokens=4).finish_reason in ("stop", "length")


THINKING = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}{% endif %}"
)


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
def test_a_template_that_opens_think_is_noted_on_every_chunk(tmp_path: Path, isolate: bool) -> None:
    path = write_tiny_llama(tmp_path / "thinking-F32.gguf", chat_template=THINKING)
    with anyformer.load(path, backend="llamacpp", isolate=isolate) as loaded:
        thinking = list(loaded.generate(ASK, thinking=True, max_new_tokens=3))
        plain = list(loaded.generate(ASK, thinking=False, max_new_tokens=3))
    assert thinking and all(chunk.thinking_opened for chunk in thinking)
    assert plain and not any(chunk.thinking_opened for chunk in plain)


def test_tool_markup_held_in_a_control_token_stays_in_the_text(tmp_path: Path) -> None:
    """Mistral's [TOOL_CALLS] and Gemma 4's <|tool_call> are control tokens: their text is kept for the reader."""
    markup = ("[TOOL_CALLS]", "<|tool_call>", '<|"|>')
    path = write_tiny_llama(tmp_path / "markup-F32.gguf", extra_specials=markup)
    with anyformer.load(path, backend="llamacpp") as loaded:
        vocabulary = loaded.handle._llama  # type: ignore[attr-defined]
        for text in (*markup, "<|im_start|>"):
            (token,) = vocabulary.tokenize(text.encode(), add_bos=False, special=True)
            reply = loaded.complete(ASK, max_new_tokens=1, logit_bias={token: 100.0}).text
            assert reply == ("" if text == "<|im_start|>" else text)  # other control tokens stay out of the text
