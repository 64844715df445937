"""Decode speed of a model on this process against the same model spread over two loopback RPC servers.

Three loads of the same GGUF, each in an isolated worker (an RPC load always is), interleaved round
by round, each timing the greedy decode of the same tokens after the same raw prompt:
- local: every layer on this host's CPU;
- rpc: two ``anyformer rpc-server`` processes (llama.cpp's server directly), layers split between them;
- rpc+relay: the same with ``--mem`` (anyformer's relay in front of each server).
On loopback the difference is the RPC protocol's own cost per token (serialising each graph,
a round trip per server per step), not a network's; the per-token figure is the extra time per token
over local. All three share the machine's cores (the servers compute what the local run computes).

    python plugins/anyformer-llamacpp/bench/bench_rpc.py [--rounds 3] [--tokens 64] [--model PATH]

Figures (2 shared cores, SmolLM2-135M Q4_1, context 512, 64 tokens, median of 3 rounds): see the
closing note of the RPC work (docs/rpc.md links here); rerun to measure on your machine.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import anyformer
from anyformer.plugin import RpcServerError, probe_rpc_server

PROMPT = "Once upon a time, in a small village by the sea, there lived"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_server(mem: str | None, threads: int) -> tuple[subprocess.Popen[bytes], str]:
    port = _port()
    command = [sys.executable, "-m", "anyformer", "rpc-server", "--port", str(port), "--threads", str(threads)]
    if mem:
        command += ["--mem", mem]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            probe_rpc_server(endpoint, timeout=1)
            return process, endpoint
        except RpcServerError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit(f"anyformer rpc-server on {endpoint} did not start")


def _decode_seconds(loaded: anyformer.Loaded, tokens: int) -> float:
    """Seconds from the first token to the last of a greedy raw continuation (the prompt is not timed)."""
    stream = loaded.generate(prompt=PROMPT, max_new_tokens=tokens, temperature=0)
    first = next(stream)
    start = time.perf_counter()
    count = first.tokens
    for chunk in stream:
        count = chunk.tokens
    seconds = time.perf_counter() - start
    if count < tokens:
        raise SystemExit(f"the model stopped after {count} tokens; use a prompt that runs longer")
    return seconds / (count - first.tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--mem", default="200MB", help="what each relayed server lends")
    args = parser.parse_args()
    model = args.model or anyformer.default_model_path()
    threads = max(1, (os.cpu_count() or 2) // 2)
    servers = [_start_server(None, threads) for _ in range(2)] + [_start_server(args.mem, threads) for _ in range(2)]
    try:
        loads = {
            "local": anyformer.load(model, backend="llamacpp", context=args.context, isolate=True),
            "rpc": anyformer.load(model, backend="llamacpp", context=args.context, rpc=[e for _, e in servers[:2]]),
            "rpc+relay": anyformer.load(
                model, backend="llamacpp", context=args.context, rpc=[e for _, e in servers[2:]]
            ),
        }
        per_token: dict[str, list[float]] = {name: [] for name in loads}
        for _ in range(args.rounds):
            for name, loaded in loads.items():
                per_token[name].append(_decode_seconds(loaded, args.tokens))
        local = statistics.median(per_token["local"])
        print(f"{model.name}, context {args.context}, {args.tokens} tokens, median of {args.rounds} rounds")
        for name, seconds in per_token.items():
            median = statistics.median(seconds)
            extra = (median - local) * 1000
            print(
                f"  {name:10s} {1 / median:7.1f} tok/s  ({local / median:.2f}x local; "
                f"{extra:+.2f} ms per token over local)"
            )
        for loaded in loads.values():
            loaded.dispose()
    finally:
        for process, _ in servers:
            process.send_signal(signal.SIGTERM)
            process.wait(10)


if __name__ == "__main__":
    main()
