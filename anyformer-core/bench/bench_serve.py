"""``anyformer serve`` against llama-cpp-python's own server on the same GGUF: throughput and time to first token.

Both servers run on loopback in their own processes with the same threads and context, serving
the embedded SmolLM2-135M-Instruct. N clients stream chat completions concurrently (each sends
its requests one after another), and the run reports total generated tokens per second and the
p50/p99 time to the first token, for both servers and as ratios (anyformer / llama_cpp.server).
Servers alternate for ``--rounds`` rounds so drift on a shared machine hits all. anyformer runs twice:
as it serves by default (an isolated worker process per model) and with ``--in-process``. Target:
throughput ratio ≥ 0.95.

llama_cpp.server runs with ``--interrupt_requests False`` so that it queues concurrent requests
as anyformer does, rather than cancelling the running one. It needs fastapi, sse-starlette,
starlette-context, pydantic-settings and uvicorn (``llama-cpp-python[server]``'s extras).

    python anyformer-core/bench/bench_serve.py [--clients 4] [--requests 2] [--max-tokens 64] [--rounds 2] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how rain forms, step by step.",
    "List ten fruits and describe each one.",
    "Describe a walk through a busy city market.",
]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def _server(command: list[str], port: int, env: dict[str, str]) -> Iterator[None]:
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                connection.request("GET", "/v1/models")
                if connection.getresponse().status == 200:
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{command[2]} did not start")
            time.sleep(0.2)
        yield
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _stream_once(port: int, model: str, prompt: str, max_tokens: int) -> tuple[float, int, int]:
    """One streamed chat: (seconds to the first content, content chunks, characters)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    started = time.perf_counter()
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
    first = None
    chunks = chars = 0
    for raw in response:
        line = raw.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        data = json.loads(line[6:])
        for choice in data.get("choices") or ():
            text = (choice.get("delta") or {}).get("content") or ""
            if text:
                first = first if first is not None else time.perf_counter() - started
                chunks += 1
                chars += len(text)
    connection.close()
    return (first if first is not None else float("nan")), chunks, chars


def _load(port: int, model: str, clients: int, requests: int, max_tokens: int) -> dict[str, float]:
    """N clients streaming concurrently; tokens per second over the wall time, TTFT percentiles."""
    results: list[tuple[float, int, int]] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        for turn in range(requests):
            outcome = _stream_once(port, model, PROMPTS[(index + turn) % len(PROMPTS)], max_tokens)
            with lock:
                results.append(outcome)

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    ttfts = sorted(r[0] for r in results)
    return {
        "tok_per_sec": sum(r[1] for r in results) / wall,
        "chars_per_sec": sum(r[2] for r in results) / wall,
        "ttft_p50": statistics.median(ttfts),
        "ttft_p99": ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))],
        "tokens": sum(r[1] for r in results),
    }


def main() -> None:
    """Run both servers in alternating rounds and print the figures and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=2, help="requests per client, one after another")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument(
        "--threads",
        type=int,
        help="decode threads for both servers (default: every usable core; on a busy 2-core machine 1 is steadier, "
        "as llama.cpp's spinning threads stall when another process takes a core)",
    )
    args = parser.parse_args()

    import anyformer
    from anyformer.machine._probe import usable_cpu_count

    model = str(anyformer.default_model_path())
    threads = str(args.threads or usable_cpu_count())
    env = {**os.environ, "ANYFORMER_LLAMACPP_THREADS": threads}
    port = _free_port()
    anyformer_serve = [sys.executable, "-m", "anyformer", "serve", "--port", str(port), "--preload", model]
    # One stream at a time, as llama_cpp.server serves (the llama.cpp plugin's bench_serve.py measures --parallel).
    anyformer_serve += ["--context", str(args.context), "--parallel", "1"]
    servers = {
        "anyformer": anyformer_serve,
        "anyformer in-process": [*anyformer_serve, "--in-process"],
        "llama_cpp.server": [
            *(sys.executable, "-m", "llama_cpp.server", "--model", model, "--model_alias", model),
            *("--port", str(port), "--n_ctx", str(args.context), "--n_threads", threads),
            *("--n_threads_batch", threads, "--interrupt_requests", "False"),
        ],
    }
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
    for _round in range(args.rounds):
        for name, command in servers.items():
            with _server(command, port, env):
                _stream_once(port, model, PROMPTS[0], 8)  # warm up: first evaluation, caches
                figures[name].append(_load(port, model, args.clients, args.requests, args.max_tokens))

    def median(name: str, key: str) -> float:
        return statistics.median(f[key] for f in figures[name])

    print(
        f"{args.clients} concurrent streaming clients × {args.requests} requests × {args.max_tokens} max tokens, "
        f"{args.rounds} rounds, {threads} threads, SmolLM2-135M-Instruct Q4_1"
    )
    print(f"{'server':22} {'tok/s':>8} {'chars/s':>8} {'TTFT p50':>9} {'TTFT p99':>9}")
    for name in servers:
        print(
            f"{name:22} {median(name, 'tok_per_sec'):8.1f} {median(name, 'chars_per_sec'):8.1f} "
            f"{median(name, 'ttft_p50') * 1000:7.0f}ms {median(name, 'ttft_p99') * 1000:7.0f}ms"
        )
    theirs = "llama_cpp.server"
    for ours in ("anyformer", "anyformer in-process"):

        def ratio(key: str, ours: str = ours) -> float:
            return median(ours, key) / median(theirs, key)

        print(
            f"ratios ({ours} / {theirs}): throughput {ratio('tok_per_sec'):.2f} (target ≥ 0.95), "
            f"TTFT p50 {ratio('ttft_p50'):.2f}, TTFT p99 {ratio('ttft_p99'):.2f} (lower is better)"
        )


if __name__ == "__main__":
    main()
