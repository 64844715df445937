"""``anyformer serve`` on this backend: the real openai client gets transformers' text and the reference vectors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "anyformer-core" / "tests"))

from http_server.server_support import serve_in_thread  # noqa: E402
from tiny_models import reference_reply  # noqa: E402

from anyformer.server import ModelPool, create_app  # noqa: E402


def test_the_openai_client_gets_the_greedy_reply_streamed_and_not(tiny_llama_dir: Path) -> None:
    messages = [{"role": "user", "content": "Hello there"}]
    expected = reference_reply(tiny_llama_dir, messages, 12)
    app = create_app(ModelPool(isolate=False), models=[str(tiny_llama_dir)])
    with serve_in_thread(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
        reply = client.chat.completions.create(
            model=str(tiny_llama_dir),
            messages=messages,
            max_tokens=12,
            temperature=0,  # type: ignore[arg-type]
        )
        assert reply.choices[0].message.content == expected
        stream = client.chat.completions.create(
            model=str(tiny_llama_dir),
            messages=messages,
            max_tokens=12,
            temperature=0,
            stream=True,  # type: ignore[arg-type]
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected


def test_the_openai_client_gets_the_reference_embeddings(tiny_encoder_dir: dict[str, Path]) -> None:
    import numpy as np
    from tiny_encoders import reference_embedding

    folder = tiny_encoder_dir["embedder"]
    texts = ["A man is eating food.", "the cat sat on the mat"]
    app = create_app(ModelPool(isolate=False), models=[str(folder)])
    with serve_in_thread(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
        reply = client.embeddings.create(model=str(folder), input=texts)
    got = np.asarray([item.embedding for item in sorted(reply.data, key=lambda d: d.index)])
    want = np.stack([reference_embedding(folder, text) for text in texts])
    assert np.abs(got - want).max() < 1e-5
    assert reply.usage.prompt_tokens > len(texts)


def test_the_openai_client_gets_a_raw_completion(tiny_llama_dir: Path) -> None:
    from test_raw_completion import _reference

    expected, _ = _reference(tiny_llama_dir, "Once upon a time", 10)
    app = create_app(ModelPool(isolate=False), models=[str(tiny_llama_dir)])
    with serve_in_thread(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
        reply = client.completions.create(
            model=str(tiny_llama_dir), prompt="Once upon a time", max_tokens=10, temperature=0, logprobs=2
        )
    assert reply.choices[0].text == expected and expected
    assert reply.choices[0].logprobs is not None and len(reply.choices[0].logprobs.tokens or []) > 0


def test_the_openai_client_transcribes_a_wav_as_the_run_api(tiny_media_dir: dict[str, Path]) -> None:
    import io
    import wave

    import numpy as np
    from tiny_media import tone

    import anyformer

    pytest.importorskip("av")
    folder = tiny_media_dir["automatic-speech-recognition"]
    samples = tone(2.0, 260.0, seed=3)
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(16000)
        writer.writeframes(pcm.tobytes())
    with anyformer.load(folder, backend="transformers", isolate=False) as model:
        expected = model.run(pcm.astype(np.float32) / 32768.0)["text"]
    app = create_app(ModelPool(isolate=False), models=[str(folder)])
    with serve_in_thread(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
        reply = client.audio.transcriptions.create(model=str(folder), file=("clip.wav", buffer.getvalue()))
    assert reply.text == expected and expected


def test_the_openai_client_gets_a_json_schema_reply_and_a_named_call(tiny_llama_dir: Path) -> None:
    """``response_format`` and a named ``tool_choice`` on this backend through the server (the random model's
    reply parses and validates only through the constraint)."""
    import json

    schema = {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "green"]}, "deep": {"type": "boolean"}},
        "required": ["colour", "deep"],
        "additionalProperties": False,
    }
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 10}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    app = create_app(ModelPool(isolate=False), models=[str(tiny_llama_dir)])
    with serve_in_thread(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
        for stream in (False, True):
            kwargs = {
                "model": str(tiny_llama_dir),
                "messages": [{"role": "user", "content": "The sea?"}],
                "max_tokens": 48,
                "response_format": {"type": "json_schema", "json_schema": {"name": "sea", "schema": schema}},
            }
            if stream:
                text = "".join(
                    c.choices[0].delta.content or ""
                    for c in client.chat.completions.create(stream=True, **kwargs)  # type: ignore[call-overload]
                    if c.choices
                )
            else:
                text = client.chat.completions.create(**kwargs).choices[0].message.content  # type: ignore[call-overload]
            value = json.loads(text or "")
            assert value["colour"] in ("red", "green") and isinstance(value["deep"], bool), text
        reply = client.chat.completions.create(
            model=str(tiny_llama_dir),
            messages=[{"role": "user", "content": "Weather in Oslo?"}],
            max_tokens=96,
            tools=[weather],  # type: ignore[list-item]
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice.message.content
        (call,) = choice.message.tool_calls or []
        arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
        assert call.function.name == "get_weather" and isinstance(arguments["city"], str)  # type: ignore[union-attr]
