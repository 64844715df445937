"""What the server shows of itself: ``/metrics``, one log line per request, ``timings`` in replies,
and ``anyformer ps`` / ``anyformer stop`` against it."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from anyformer.cli._main import main

from .server_support import plain_request

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, **extra}


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics`` by name and sorted labels."""
    reply = plain_request("GET", f"{url}/metrics")
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(reply.body.decode())
        for sample in family.samples
    }


def test_metrics_count_each_replys_generated_tokens(paced_server: Any, model_folders: Any) -> None:
    url, _backend, _pool = paced_server()
    model = model_folders("paced-model")
    for tokens in (5, 7):
        assert plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=tokens)).status == 200
    streamed = plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=3, stream=True))
    assert streamed.status == 200
    assert plain_request("POST", f"{url}/v1/chat/completions", chat("org/not-served")).status == 404
    samples = scrape(url)
    labels = (("backend", "paced"), ("model", model))
    assert samples[("anyformer_generated_tokens_total", labels)] == 5 + 7 + 3
    route = "/v1/chat/completions"
    assert samples[("anyformer_requests_total", (("route", route), ("status", "200")))] == 3
    assert samples[("anyformer_requests_total", (("route", route), ("status", "404")))] == 1
    assert samples[("anyformer_errors_total", (("code", "MODEL_NOT_FOUND"),))] == 1
    assert samples[("anyformer_time_to_first_token_seconds_count", (("backend", "paced"),))] == 3
    # Each paced token takes 10 ms: every generation's mean gap falls in the 10 to 20 ms buckets.
    gaps = ("anyformer_inter_token_seconds_bucket", (("backend", "paced"), ("le", "0.005")))
    assert samples[gaps] == 0
    assert samples[("anyformer_inter_token_seconds_count", (("backend", "paced"),))] == 3
    assert samples[("anyformer_loaded_models", ())] == 1
    memory = (("backend", "paced"), ("memory", "ram"), ("model", model))
    assert samples[("anyformer_loaded_model_bytes", memory)] == 10**6
    assert samples[("anyformer_queue_depth", ())] == 0


def test_an_error_inside_a_stream_is_counted_by_its_code(paced_server: Any, model_folders: Any) -> None:
    from .server_support import CRASH_PROMPT

    url, _backend, _pool = paced_server()
    body = chat(model_folders("paced-model"), stream=True)
    body["messages"][0]["content"] = CRASH_PROMPT
    reply = plain_request("POST", f"{url}/v1/chat/completions", body)
    assert reply.status == 200 and b"BACKEND_CRASHED" in reply.body
    assert scrape(url)[("anyformer_errors_total", (("code", "BACKEND_CRASHED"),))] == 1


def test_a_reply_carries_llama_server_timings(paced_server: Any, model_folders: Any) -> None:
    url, _backend, _pool = paced_server()
    model = model_folders("paced-model")
    timings = plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=6)).json()["timings"]
    assert timings["predicted_n"] == 6
    # Five gaps of about 10 ms each after the first token (sleep never returns early).
    assert timings["predicted_ms"] >= 5 * 10 and timings["predicted_per_token_ms"] >= 10
    assert timings["predicted_per_second"] == pytest.approx(1000 / timings["predicted_per_token_ms"], rel=1e-3)
    assert timings["prompt_ms"] >= 10  # the first token's 10 ms are the prompt's
    streamed = plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=4, stream=True))
    events = [json.loads(line[6:]) for line in streamed.body.decode().split("\n\n") if line.startswith("data: {")]
    last = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(last) == 1 and last[0]["timings"]["predicted_n"] == 4


def test_each_request_writes_one_log_line(paced_server: Any, model_folders: Any, caplog: Any) -> None:
    url, _backend, _pool = paced_server()
    model = model_folders("paced-model")
    with caplog.at_level(logging.INFO, logger="anyformer.server"):
        assert plain_request("POST", f"{url}/v1/chat/completions", chat(model, max_tokens=4)).status == 200
        assert plain_request("GET", f"{url}/v1/nope").status == 404
    lines = [r.getMessage() for r in caplog.records if r.name == "anyformer.server"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("POST /v1/chat/completions 200 ")
    for part in (f"model={model}", "backend=paced", "generated_tokens=4", "ttft_ms=", "tok_s="):
        assert part in lines[0]
    assert lines[1].startswith("GET /v1/nope 404 code=NOT_FOUND")


def test_configure_logging_appends_to_the_log_file(tmp_path: Any) -> None:
    from anyformer.server._request_log import LOGGER, configure_logging

    path = tmp_path / "requests.log"
    saved = LOGGER.handlers[:], LOGGER.level, LOGGER.propagate
    try:
        configure_logging("warning", str(path))
        LOGGER.info("not at warning")
        LOGGER.warning("kept")
        for handler in LOGGER.handlers:
            handler.flush()
    finally:
        for handler in LOGGER.handlers:
            handler.close()
        LOGGER.handlers[:], LOGGER.level, LOGGER.propagate = saved
    text = path.read_text()
    assert "kept" in text and "not at warning" not in text


def test_ps_and_stop_from_the_command_line(paced_server: Any, model_folders: Any, capsys: Any) -> None:
    url, backend, _pool = paced_server(api_key="sesame")
    model = model_folders("paced-model")
    key = {"Authorization": "Bearer sesame"}
    assert plain_request("POST", f"{url}/v1/chat/completions", chat(model), headers=key).status == 200
    assert main(["ps", "--url", url, "--api-key", "sesame"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["MODEL", "BACKEND", "GPU", "RAM", "CONTEXT", "STREAMS", "IDLE", "UNTIL"]
    assert table[1].startswith(model) and " paced " in table[1] and " 0/1 " in table[1] and "(in " in table[1]
    assert main(["stop", model, "--url", url, "--api-key", "sesame"]) == 0
    assert capsys.readouterr().out.strip() == f"{model}: unloaded"
    assert backend.handles[0].disposed
    assert main(["ps", "--url", url, "--api-key", "sesame"]) == 0
    assert capsys.readouterr().out.strip() == "no models loaded"
    assert main(["stop", model, "--url", url, "--api-key", "sesame"]) == 1
    assert "MODEL_NOT_FOUND" in capsys.readouterr().err
    assert main(["ps", "--url", url]) == 2  # no key
    assert "API key" in capsys.readouterr().err


def test_ps_says_when_no_server_answers(capsys: Any) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert main(["ps", "--url", f"http://127.0.0.1:{port}"]) == 1
    assert "OFFLINE: no anyformer server answers" in capsys.readouterr().err
