"""Decode speed of a model on this process against the same model spread over two loopback RPC servers.

Three loads of the same GGUF, each in an isolated worker (an RPC load always is), interleaved round
by round, each timing the greedy decode of the same tokens after the same raw prompt:
- local: every layer on this host's CPU;
- rpc: two ``anyformer rpc-server`` processes (llama.cpp's server directly), layers split between them;
- rpc+relay: the same with ``--mem`` (anyformer's relay in front of each server).
On loopback the difference is the RPC protocol's own cost per token (serialising each graph,
a round trip per server per step), not a network's; the per-token figure is the extra time per token
over local. All three share the machine's cores (the servers compute what the local run computes).

    python plugins/anyformer-llamacpp/bench/bench_rpc.py [--rounds 3] [--tokens 64] [--model PATH] [--threads N]

Figures (2 shared cores, 1 thread each, median of 3 rounds, 2026-12-01; docs/rpc.md has the table):
SmolLM2-135M Q4_1, 48 tokens: local 137.3 tok/s, two servers 105.3 (0.77x), through the relay 121.8
(0.89x). Random weights in SmolLM2-1.7B's shapes (``random_gguf.py write --shape 1.7b``), 32 tokens:
Q4_1 12.3 / 12.2 / 12.3 tok/s (0.99x, 1.00x); Q4_0 19.1 / 14.5 / 15.0 (0.76x, 0.79x: most likely the host's
repacked Q4_0 kernels, which an RPC server does not use). 1.0 request that waits for a reply per
token and server.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyformer
from anyformer.plugin import RpcServerError, probe_rpc_server

PROMPT = "Once upon a time, in a small village by the sea, there lived"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_server(mem: str | None, threads: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _port()
    command = [sys.executable, "-m", "anyformer", "rpc-server", "--port", str(port), "--threads", str(threads)]
    if mem:
        command += ["--mem", mem]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=sink)
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


def _relayed_counts(log: Path) -> tuple[int, int]:
    """(requests, round trips) of the last client the relay reported in ``log``."""
    lines = [line for line in log.read_text().splitlines() if "waited for a reply" in line]
    words = lines[-1].split("; ")[-1].split()
    return int(words[0]), int(words[2])


def _round_trips_per_token(model: Path, context: int, endpoints: list[str], logs: list[Path], tokens: int) -> float:
    """Requests that wait for a reply, per decoded token and server: two loads that differ only in tokens."""
    totals = []
    for n in (tokens, 2 * tokens):
        with anyformer.load(model, backend="llamacpp", context=context, rpc=endpoints) as loaded:
            _decode_seconds(loaded, n)
        time.sleep(1.0)  # the relay writes its line once the worker has hung up
        totals.append(sum(_relayed_counts(log)[1] for log in logs))
    return (totals[1] - totals[0]) / tokens / len(logs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--mem", default="200MB", help="what each relayed server lends")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    args = parser.parse_args()
    model = args.model or anyformer.default_model_path()
    threads = args.threads
    # The local run computes with as many threads as one server, so the comparison is the protocol's
    # cost, not a thread count (llama.cpp's spinning threads also slow down badly on busy cores).
    os.environ["ANYFORMER_LLAMACPP_THREADS"] = str(threads)
    folder = Path(tempfile.mkdtemp(prefix="bench-rpc-"))
    logs = [folder / f"server{i}.log" for i in range(4)]
    servers = [_start_server(None, threads, logs[i]) for i in range(2)]
    servers += [_start_server(args.mem, threads, logs[i]) for i in range(2, 4)]
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
        trips = _round_trips_per_token(model, args.context, [e for _, e in servers[2:]], logs[2:], args.tokens)
        print(f"  {trips:.1f} requests that wait for a reply per token and server (through the relay)")
    finally:
        for process, _ in servers:
            process.send_signal(signal.SIGTERM)
            process.wait(10)


if __name__ == "__main__":
    main()
