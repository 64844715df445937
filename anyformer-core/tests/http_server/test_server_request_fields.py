"""Every request field is read or refused (docs/server.md, "Request fields"), on the paced backend.

The paced backend honours no optional option: whatever would change its reply is a 400 naming the
field; fields that change nothing are accepted.
"""

from __future__ import annotations

from typing import Any

import pytest

from anyformer.server._chat_reply import ReasoningSplitter, split_reasoning
from anyformer.server._request_fields import CHAT_FIELDS, COMPLETION_FIELDS

from .server_support import plain_request

SERVER_DOC_FIELDS = CHAT_FIELDS | COMPLETION_FIELDS


def chat(url: str, model: str, **fields: Any) -> Any:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}
    return plain_request("POST", f"{url}/v1/chat/completions", body)


def test_an_unknown_field_is_a_400_naming_it(paced_server: Any, model_folders: Any) -> None:
    url, _backend, _pool = paced_server()
    reply = chat(url, model_folders("m"), frobnicate=1, best_guess=True)
    assert reply.status == 400
    error = reply.json()["error"]
    assert error["param"] == "best_guess" and "'frobnicate'" in error["message"]
    embeddings = plain_request("POST", f"{url}/v1/embeddings", {"model": "m", "input": "x", "dimensions": 8})
    assert embeddings.status == 400 and embeddings.json()["error"]["param"] == "dimensions"


def test_fields_that_change_nothing_are_accepted(paced_server: Any, model_folders: Any) -> None:
    url, _backend, _pool = paced_server()
    reply = chat(url, model_folders("m"), user="u1", metadata={"k": "v"}, store=False, frequency_penalty=0)
    assert reply.status == 200, reply.json()


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"min_p": 0.1}, "min_p"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"repeat_penalty": 1.2}, "repeat_penalty"),
        ({"logit_bias": {"5": -100}}, "logit_bias"),
        ({"top_k": 0}, "top_k"),
        ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"reasoning_effort": "high"}, "chat_template_kwargs"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ],
)
def test_a_field_the_backend_does_not_honour_is_a_400_naming_it(
    paced_server: Any, model_folders: Any, fields: dict[str, Any], param: str
) -> None:
    url, _backend, _pool = paced_server()
    reply = chat(url, model_folders("m"), **fields)
    assert reply.status == 400, reply.json()
    error = reply.json()["error"]
    assert error["param"] == param and "not honoured by paced" in error["message"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"min_p": 2}, "min_p"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"1": 500}}, "logit_bias"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"chat_template_kwargs": {"enable_thinking": "yes"}}, "chat_template_kwargs"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
    ],
)
def test_a_malformed_field_is_a_400_naming_it(
    paced_server: Any, model_folders: Any, fields: dict[str, Any], param: str
) -> None:
    url, _backend, _pool = paced_server()
    reply = chat(url, model_folders("m"), **fields)
    assert reply.status == 400 and reply.json()["error"]["param"] == param, reply.json()


def test_enable_thinking_alone_is_honoured_everywhere(paced_server: Any, model_folders: Any) -> None:
    url, _backend, _pool = paced_server()
    reply = chat(url, model_folders("m"), chat_template_kwargs={"enable_thinking": True})
    assert reply.status == 200, reply.json()


def test_docs_list_every_request_field() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "server.md").read_text()
    missing = sorted(name for name in SERVER_DOC_FIELDS if f"`{name}`" not in doc)
    assert not missing, f"docs/server.md's request fields table lacks {missing}"


@pytest.mark.parametrize("cut", [1, 2, 3, 5, 7])
def test_think_is_split_into_reasoning_the_same_streamed_and_whole(cut: int) -> None:
    reply = "<think>\nweigh it up</think>\n\nThe answer."
    splitter = ReasoningSplitter()
    pieces = [splitter.feed(reply[i : i + cut]) for i in range(0, len(reply), cut)] + [splitter.finish()]
    streamed = ("".join(p[0] for p in pieces), "".join(p[1] for p in pieces))
    assert streamed == split_reasoning(reply) == ("weigh it up", "The answer.")
    assert split_reasoning("No thinking <think> here") == ("", "No thinking <think> here")
