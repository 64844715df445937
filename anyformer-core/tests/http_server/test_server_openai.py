"""The server against the real ``openai`` client, on the embedded SmolLM2 and a tiny GGUF side by side."""

from __future__ import annotations

import base64
import math
import os
import signal
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

import anyformer

from .server_support import plain_request

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow


def client_for(real_server: tuple[str, Any]) -> Any:
    url, _pool = real_server
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def hello(text: str = "Say hello in one short sentence.") -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_chat_completion_answers_with_usage_counted(real_server: tuple[str, Any], smollm2_path: Path) -> None:
    reply = client_for(real_server).chat.completions.create(model=str(smollm2_path), messages=hello(), max_tokens=12)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert 1 <= reply.usage.completion_tokens <= 12
    # The isolated backend reports the prompt's length on its chunks; it must be llama.cpp's own count.
    with anyformer.load(smollm2_path, backend="llamacpp") as local:
        expected = len(local.handle.prompt_tokens(hello(), False))
    assert reply.usage.prompt_tokens == expected
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streamed_chat_matches_the_whole_reply_at_temperature_zero(
    real_server: tuple[str, Any], smollm2_path: Path
) -> None:
    client = client_for(real_server)
    whole = client.chat.completions.create(model=str(smollm2_path), messages=hello(), max_tokens=16, temperature=0)
    stream = client.chat.completions.create(
        model=str(smollm2_path),
        messages=hello(),
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert text == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


def test_two_models_serve_side_by_side(real_server: tuple[str, Any], smollm2_path: Path, tiny_gguf_path: Path) -> None:
    client = client_for(real_server)
    tiny = client.chat.completions.create(model=str(tiny_gguf_path), messages=hello("hi"), max_tokens=5)
    small = client.chat.completions.create(model=str(smollm2_path), messages=hello("hi"), max_tokens=5)
    assert tiny.usage.completion_tokens >= 1 and small.usage.completion_tokens >= 1
    listed = {model.id for model in client.models.list().data}
    assert {str(tiny_gguf_path), str(smollm2_path)} <= listed


def test_sampling_with_a_seed_repeats_and_stop_cuts_the_text(real_server: tuple[str, Any], smollm2_path: Path) -> None:
    client = client_for(real_server)
    runs = [
        client.chat.completions.create(
            model=str(smollm2_path), messages=hello("Tell me a story."), max_tokens=10, temperature=0.9, seed=7
        )
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    greedy = client.chat.completions.create(model=str(smollm2_path), messages=hello(), max_tokens=12).choices[0]
    cut_at = greedy.message.content.split()[1]
    stopped = client.chat.completions.create(model=str(smollm2_path), messages=hello(), max_tokens=12, stop=[cut_at])
    assert cut_at not in stopped.choices[0].message.content
    assert stopped.choices[0].finish_reason == "stop"


def _create_completion(path: Path, prompt: str, max_tokens: int) -> str:
    """llama-cpp-python's own greedy raw completion of ``prompt`` on the same GGUF."""
    from llama_cpp import Llama

    reference = Llama(model_path=str(path), n_ctx=2048, n_threads=2, flash_attn=True, verbose=False)
    try:
        reply = reference.create_completion(prompt, temperature=0.0, top_k=1, max_tokens=max_tokens)
        return str(reply["choices"][0]["text"])  # type: ignore[index]
    finally:
        reference.close()


def test_completions_continue_the_raw_prompt_streamed_and_not(real_server: tuple[str, Any], smollm2_path: Path) -> None:
    client = client_for(real_server)
    prompt = "The capital of France is"
    completion = client.completions.create(model=str(smollm2_path), prompt=prompt, max_tokens=10)
    assert completion.object == "text_completion"
    assert completion.choices[0].text == _create_completion(smollm2_path, prompt, 10)
    assert completion.usage.completion_tokens == 10
    streamed = [
        chunk
        for chunk in client.completions.create(
            model=str(smollm2_path), prompt=prompt, max_tokens=10, stream=True, stream_options={"include_usage": True}
        )
    ]
    assert "".join(c.choices[0].text for c in streamed if c.choices) == completion.choices[0].text
    assert streamed[-1].usage.prompt_tokens == completion.usage.prompt_tokens


def test_completions_take_a_list_of_prompts_one_choice_each(real_server: tuple[str, Any], smollm2_path: Path) -> None:
    client = client_for(real_server)
    prompts = ["Once upon a time", "def add(a, b):"]
    singles = [
        client.completions.create(model=str(smollm2_path), prompt=p, max_tokens=6).choices[0].text for p in prompts
    ]
    both = client.completions.create(model=str(smollm2_path), prompt=prompts, max_tokens=6)
    assert [c.index for c in both.choices] == [0, 1]
    assert [c.text for c in both.choices] == singles
    pieces: dict[int, str] = {0: "", 1: ""}
    for chunk in client.completions.create(model=str(smollm2_path), prompt=prompts, max_tokens=6, stream=True):
        for choice in chunk.choices:
            pieces[choice.index] += choice.text
    assert [pieces[0], pieces[1]] == singles


def test_completions_echo_the_prompt(real_server: tuple[str, Any], smollm2_path: Path) -> None:
    client = client_for(real_server)
    prompt = "Once upon a time"
    plain = client.completions.create(model=str(smollm2_path), prompt=prompt, max_tokens=5).choices[0].text
    echoed = client.completions.create(model=str(smollm2_path), prompt=prompt, max_tokens=5, echo=True)
    assert echoed.choices[0].text == prompt + plain
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model=str(smollm2_path), prompt=prompt, max_tokens=5, echo=True, stream=True)
        if c.choices
    )
    assert streamed == prompt + plain


def test_completions_logprobs_equal_llama_cpp_python_streamed_and_not(
    real_server: tuple[str, Any], smollm2_path: Path
) -> None:
    from llama_cpp import Llama

    prompt = "The capital of France is"
    reference = Llama(
        model_path=str(smollm2_path), n_ctx=2048, n_threads=2, verbose=False, logits_all=True, flash_attn=True
    )
    try:
        expected = reference.create_completion(prompt, temperature=0.0, top_k=1, max_tokens=6, logprobs=2)
    finally:
        reference.close()
    want = expected["choices"][0]["logprobs"]  # type: ignore[index]
    client = client_for(real_server)
    got = client.completions.create(model=str(smollm2_path), prompt=prompt, max_tokens=6, logprobs=2).choices[0]
    assert got.logprobs.tokens == want["tokens"]
    assert got.logprobs.token_logprobs == pytest.approx(want["token_logprobs"], abs=1e-4)
    assert got.logprobs.text_offset == want["text_offset"]
    for ours, theirs in zip(got.logprobs.top_logprobs, want["top_logprobs"], strict=True):
        assert ours == pytest.approx(theirs, abs=1e-4)
    tokens: list[str] = []
    for chunk in client.completions.create(
        model=str(smollm2_path), prompt=prompt, max_tokens=6, logprobs=2, stream=True
    ):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            tokens += chunk.choices[0].logprobs.tokens
    assert tokens == want["tokens"]


def test_completions_suffix_on_a_model_without_fim_tokens_is_a_clear_400(
    real_server: tuple[str, Any], smollm2_path: Path
) -> None:
    client = client_for(real_server)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=str(smollm2_path), prompt="def f(", suffix=")\n", max_tokens=4)
    assert "fill-in-the-middle" in str(caught.value)


def _prompt_scores(path: Path, prompt: str) -> tuple[list[str], list[float]]:
    """Each prompt token's text and log-probability from llama.cpp's logits at every position."""
    import numpy as np
    from llama_cpp import Llama

    reference = Llama(model_path=str(path), n_ctx=2048, n_threads=2, verbose=False, logits_all=True, flash_attn=True)
    try:
        tokens = reference.tokenize(prompt.encode(), add_bos=True, special=True)
        reference.eval(tokens)
        rows = Llama.logits_to_logprobs(reference.scores[: len(tokens)].astype(np.float64))
        texts = [reference.detokenize([t]).decode("utf-8", "ignore") for t in tokens]
        return texts, [float(rows[i][tokens[i + 1]]) for i in range(len(tokens) - 1)]
    finally:
        reference.close()


def test_completions_score_the_prompt_with_echo_and_logprobs(real_server: tuple[str, Any], smollm2_path: Path) -> None:
    """lm-evaluation-harness's loglikelihood request: echo, logprobs and max_tokens=0, streamed and not."""
    prompt = "The capital of France is Paris"
    texts, values = _prompt_scores(smollm2_path, prompt)
    client = client_for(real_server)
    got = client.completions.create(model=str(smollm2_path), prompt=prompt, echo=True, logprobs=2, max_tokens=0)
    choice = got.choices[0]
    assert choice.text == prompt and choice.finish_reason == "length"
    assert choice.logprobs.tokens == texts
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
    assert choice.logprobs.token_logprobs[1:] == pytest.approx(values, abs=1e-4)
    assert choice.logprobs.text_offset == [len("".join(texts[:i])) for i in range(len(texts))]
    assert all(len(top) >= 2 for top in choice.logprobs.top_logprobs[1:])
    assert got.usage.prompt_tokens == len(texts) and got.usage.completion_tokens == 0
    pieces = list(
        client.completions.create(
            model=str(smollm2_path), prompt=prompt, echo=True, logprobs=2, max_tokens=0, stream=True
        )
    )
    assert "".join(p.choices[0].text for p in pieces) == prompt
    assert [t for p in pieces for t in (p.choices[0].logprobs.tokens if p.choices[0].logprobs else [])] == texts
    streamed = [v for p in pieces if p.choices[0].logprobs for v in p.choices[0].logprobs.token_logprobs]
    assert streamed == choice.logprobs.token_logprobs


def test_completions_echo_logprobs_carry_the_reply_after_the_prompt(
    real_server: tuple[str, Any], smollm2_path: Path
) -> None:
    client = client_for(real_server)
    prompt = "Once upon a time"
    plain = client.completions.create(model=str(smollm2_path), prompt=prompt, max_tokens=3, logprobs=1).choices[0]
    both = client.completions.create(model=str(smollm2_path), prompt=prompt, max_tokens=3, logprobs=1, echo=True)
    scored = both.choices[0].logprobs
    count = len(scored.tokens) - len(plain.logprobs.tokens)
    assert both.choices[0].text == prompt + plain.text
    assert scored.tokens[count:] == plain.logprobs.tokens
    assert scored.token_logprobs[count:] == pytest.approx(plain.logprobs.token_logprobs, abs=1e-6)
    assert scored.text_offset[count:] == plain.logprobs.text_offset
    assert "".join(scored.tokens[:count]) == prompt


def test_completions_echo_logprobs_refuse_a_suffix(real_server: tuple[str, Any], smollm2_path: Path) -> None:
    body = {"model": str(smollm2_path), "prompt": "hi", "max_tokens": 0, "logprobs": 1, "echo": True, "suffix": "x"}
    reply = plain_request("POST", f"{real_server[0]}/v1/completions", body)
    assert reply.status == 400
    assert reply.json()["error"]["param"] == "suffix"


def test_completions_max_tokens_zero_needs_echo_and_logprobs(real_server: tuple[str, Any], smollm2_path: Path) -> None:
    body = {"model": str(smollm2_path), "prompt": "hi", "max_tokens": 0, "echo": True}
    reply = plain_request("POST", f"{real_server[0]}/v1/completions", body)
    assert reply.status == 400
    assert reply.json()["error"]["param"] == "max_tokens"


@pytest.mark.parametrize(
    ("field", "value"),
    [("n", 2), ("logprobs", 99), ("suffix", 3), ("best_of", 3), ("prompt", [[1, 2, 3]]), ("prompt", [])],
)
def test_completions_refuse_what_they_cannot_honour(
    real_server: tuple[str, Any], smollm2_path: Path, field: str, value: Any
) -> None:
    body: dict[str, Any] = {"model": str(smollm2_path), "prompt": "hi", "max_tokens": 2, field: value}
    reply = plain_request("POST", f"{real_server[0]}/v1/completions", body)
    assert reply.status == 400
    assert reply.json()["error"]["param"] == field


def test_embeddings_are_unit_vectors_one_per_input(real_server: tuple[str, Any], smollm2_path: Path) -> None:
    client = client_for(real_server)
    result = client.embeddings.create(model=str(smollm2_path), input=["the cat sat", "the cat sat", "stock prices"])
    vectors = [item.embedding for item in result.data]
    assert len(vectors) == 3 and len({len(v) for v in vectors}) == 1 and len(vectors[0]) > 16
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-3) for v in vectors)
    assert vectors[0] == pytest.approx(vectors[1])
    assert result.usage.prompt_tokens > 0
    # The chat model stays loaded beside its embedding twin.
    assert client.chat.completions.create(model=str(smollm2_path), messages=hello("hi"), max_tokens=3).choices


def test_an_image_to_a_text_only_backend_is_a_bad_request(real_server: tuple[str, Any], smollm2_path: Path) -> None:
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()
    content = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        client_for(real_server).chat.completions.create(
            model=str(smollm2_path), messages=[{"role": "user", "content": content}], max_tokens=4
        )
    assert caught.value.body["code"] == "BAD_REQUEST"


def test_unknown_model_is_404_and_bad_options_are_400(real_server: tuple[str, Any], smollm2_path: Path) -> None:
    client = client_for(real_server)
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="/no/such/model.gguf", messages=hello(), max_tokens=4)
    assert missing.value.body["code"] == "MODEL_NOT_FOUND"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=str(smollm2_path), messages=hello(), max_tokens=0)
    assert bad.value.body["param"] == "max_tokens"


def test_malformed_json_is_400_in_openais_error_shape(real_server: tuple[str, Any]) -> None:
    url, _pool = real_server
    response = plain_request("POST", f"{url}/v1/chat/completions", b'{"model": "x", "messages": [')
    assert response.status == 400
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code", "param"}
    assert error["code"] == "BAD_REQUEST" and error["type"] == "invalid_request_error"


def test_check_endpoint_shows_every_verdict_and_the_choice(real_server: tuple[str, Any], smollm2_path: Path) -> None:
    url, _pool = real_server
    result = plain_request("GET", f"{url}/api/check?model={urllib.parse.quote(str(smollm2_path))}").json()
    assert result["chosen"] == result["verdicts"][0]["backend"]
    assert result["verdicts"][0]["ok"] is True
    assert result["model"]["architecture"] == "llama"


def test_the_chat_page_is_served_at_the_root(real_server: tuple[str, Any]) -> None:
    url, _pool = real_server
    response = plain_request("GET", url + "/")
    assert response.status == 200 and "text/html" in response.headers["content-type"]
    assert b'src="/static/chat.js"' in response.body
    script = plain_request("GET", url + "/static/chat.js")
    assert script.status == 200 and "javascript" in script.headers["content-type"]
    assert b"/v1/chat/completions" in script.body and b"/api/check" in script.body


def _worker_pid(pool: Any, model: Path, task: str = "text-generation") -> int:
    pids = [m["worker_pid"] for m in pool.loaded() if m["id"] == str(model) and m["task"] == task]
    # The server isolates every model; a model loaded in the server's own process is a regression.
    assert pids, f"{model} ({task}) is not in the pool: {pool.loaded()}"
    assert isinstance(pids[0], int), f"{model} runs in the server's process, not in a worker: {pool.loaded()}"
    return pids[0]


def test_a_killed_worker_is_one_500_and_the_next_request_reloads(
    real_server: tuple[str, Any], tiny_gguf_path: Path
) -> None:
    client = client_for(real_server)
    _url, pool = real_server
    client.chat.completions.create(model=str(tiny_gguf_path), messages=hello("hi"), max_tokens=2)
    os.kill(_worker_pid(pool, tiny_gguf_path), signal.SIGKILL)
    with pytest.raises(openai.InternalServerError) as crashed:
        client.chat.completions.create(model=str(tiny_gguf_path), messages=hello("hi"), max_tokens=2)
    assert crashed.value.body["code"] == "BACKEND_CRASHED"
    again = client.chat.completions.create(model=str(tiny_gguf_path), messages=hello("hi"), max_tokens=2)
    assert again.usage.completion_tokens >= 1


def test_a_worker_killed_mid_stream_ends_it_with_an_error(real_server: tuple[str, Any], smollm2_path: Path) -> None:
    client = client_for(real_server)
    _url, pool = real_server
    client.chat.completions.create(model=str(smollm2_path), messages=hello("hi"), max_tokens=2)
    pid = _worker_pid(pool, smollm2_path)
    stream = client.chat.completions.create(
        model=str(smollm2_path),
        messages=hello("Count from 1 to 500, separated by commas."),
        max_tokens=400,
        stream=True,
    )
    with pytest.raises(openai.APIError) as crashed:
        for index, _chunk in enumerate(stream):
            if index == 3:
                os.kill(pid, signal.SIGKILL)
    assert crashed.value.body["code"] == "BACKEND_CRASHED"
    again = client.chat.completions.create(model=str(smollm2_path), messages=hello("hi"), max_tokens=2)
    assert again.usage.completion_tokens >= 1
