"""A model spread over llama.cpp RPC servers on loopback: the same text, clean errors, fast refusals.

Two ``anyformer rpc-server --mem`` processes each lend less memory than SmolLM2's GGUF takes; the
model loads across both and its greedy text equals the single-process run's. A server killed
mid-stream is an error naming it within seconds; an unreachable address and a server speaking
another protocol version are refused before llama.cpp touches them.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

import pytest
from rpc_processes import require_rpc, require_rpc_wheel, rpc_servers

import anyformer
from anyformer import AnyformerError, ErrorCode

PROMPT = "The three primary colours are"
CONTEXT = 96
#: Less than SmolLM2-135M Q4_1's 98 MB file: neither server could hold the model alone.
MEM = "90MB"


def greedy(loaded: anyformer.Loaded, tokens: int) -> str:
    return "".join(c.delta for c in loaded.generate(prompt=PROMPT, max_new_tokens=tokens, temperature=0))


def test_a_model_larger_than_each_server_runs_across_two_with_the_same_text(smollm2_path: Path) -> None:
    require_rpc()
    assert smollm2_path.stat().st_size > 90 * 10**6
    with anyformer.load(smollm2_path, backend="llamacpp", context=CONTEXT) as local:
        expected = greedy(local, 32)
    with rpc_servers(2, MEM) as servers:
        with anyformer.load(
            smollm2_path, backend="llamacpp", context=CONTEXT, rpc=[s.endpoint for s in servers]
        ) as spread:
            assert spread.isolated
            assert spread.verdict is not None and spread.verdict.estimate is not None
            split = spread.verdict.estimate.details["rpc"]
            assert [d["layers"] > 0 for d in split["devices"]] == [True, True]
            text = greedy(spread, 32)
        assert text == expected
        # Each server really held part of the model, and no more than it lends.
        for server in servers:
            deadline = time.monotonic() + 10
            while not server.peak_bytes() and time.monotonic() < deadline:
                time.sleep(0.05)
            (peak,) = server.peak_bytes()
            assert 10 * 10**6 < peak <= 90 * 10**6


def test_a_model_that_fits_no_single_host_but_all_of_them_is_accepted_with_the_split(smollm2_path: Path) -> None:
    require_rpc()
    small = anyformer.probe(gpu=False, ram_bytes=160 * 10**6)  # too little for SmolLM2 alone at this context
    _model, alone = anyformer.check(smollm2_path, backend="llamacpp", context=CONTEXT, caps=small)
    assert alone.chosen is None and alone.verdicts[0].code == "memory"
    with rpc_servers(2, MEM) as servers:
        _model, spread = anyformer.check(
            smollm2_path, backend="llamacpp", context=CONTEXT, caps=small, rpc=[s.endpoint for s in servers]
        )
    assert spread.chosen is not None and spread.chosen.estimate is not None
    split = spread.chosen.estimate.details["rpc"]
    assert split["host_layers"] == 0 and sum(d["layers"] for d in split["devices"]) == 30
    assert [d["free"] for d in split["devices"]] == [90 * 10**6, 90 * 10**6]
    assert spread.chosen.estimate.ram_bytes <= small.ram_bytes


def test_a_server_killed_mid_stream_is_an_error_naming_it_and_the_next_load_works(smollm2_path: Path) -> None:
    require_rpc()
    with rpc_servers(2, MEM) as servers:
        endpoints = [s.endpoint for s in servers]
        with anyformer.load(smollm2_path, backend="llamacpp", context=CONTEXT, rpc=endpoints) as spread:
            stream = spread.generate(prompt=PROMPT, max_new_tokens=60, temperature=0)
            next(stream)
            servers[0].kill()
            started = time.monotonic()
            with pytest.raises(AnyformerError) as info:
                for _ in stream:
                    pass
            assert time.monotonic() - started < 10
        assert info.value.code is ErrorCode.BACKEND_CRASHED
        assert servers[0].endpoint in info.value.message and servers[1].endpoint not in info.value.message
        with anyformer.load(smollm2_path, backend="llamacpp", context=CONTEXT, rpc=[servers[1].endpoint]) as again:
            assert again.verdict is not None and again.verdict.estimate is not None
            assert again.verdict.estimate.details["rpc"]["devices"][0]["layers"] > 0
            assert greedy(again, 4)


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_an_unreachable_server_is_a_runtime_refusal_naming_it_at_once(smollm2_path: Path) -> None:
    require_rpc_wheel()
    endpoint = _closed_port()
    started = time.monotonic()
    _model, selection = anyformer.check(smollm2_path, backend="llamacpp", rpc=[endpoint])
    assert time.monotonic() - started < 3
    (verdict,) = selection.verdicts
    assert not verdict.ok and verdict.code == "runtime" and endpoint in verdict.reason
    with pytest.raises(AnyformerError) as info:
        anyformer.load(smollm2_path, backend="llamacpp", rpc=endpoint)
    assert endpoint in info.value.message


def test_a_server_of_another_protocol_version_is_a_clean_refusal(smollm2_path: Path) -> None:
    require_rpc_wheel()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(2)
    endpoint = f"127.0.0.1:{listener.getsockname()[1]}"

    def answer_version_8() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            with client:
                client.recv(64)  # HELLO
                client.sendall(struct.pack("<Q", 28) + bytes([8, 0, 0, 0]) + bytes(24))

    threading.Thread(target=answer_version_8, daemon=True).start()
    try:
        _model, selection = anyformer.check(smollm2_path, backend="llamacpp", rpc=[endpoint])
    finally:
        listener.close()
    (verdict,) = selection.verdicts
    assert not verdict.ok and verdict.code == "runtime"
    assert endpoint in verdict.reason and "8.0.0" in verdict.reason
