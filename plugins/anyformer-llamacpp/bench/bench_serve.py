"""``anyformer serve --parallel N`` (streams batched in one decode step) against the serialised server and peers.

Every server runs on loopback in its own process, on the embedded SmolLM2-135M-Instruct with the
same threads and per-stream context. At 1, 4 and 8 concurrent streaming clients (each sends
``--requests`` chat completions one after another) the run reports aggregate generated tokens per
second and the p50/p99 time to the first token, for:

- ``anyformer --parallel 1``: today's serialised server (one stream per model, the rest queue);
- ``anyformer --parallel N``: the batched server (``--parallel``, default 4: what serve's auto gives 2 threads);
- ``llama_cpp.server``: llama-cpp-python's server (serialises; only when its extras are installed);
- ``llama-server --parallel N``: llama.cpp's own server, when a build of it is found (``--llama-server``,
  else the newest ``llama-server`` under ``~/.cache/anyformer-wheelhouse/llama-cpp-tools-*``).

Servers alternate for ``--rounds`` rounds so drift on a shared machine hits all; the figures are
medians over rounds. Target: at 4 clients the batched aggregate ≥ 1.6× the serialised one.

Each row also gives the CPU time the server spent per generated token (``CPU ms/tok``): user and
system time of the server process and every process under it (an isolated worker), read from
``/proc`` before and after the load, and the part of it the server process itself spent (``server
ms``: HTTP, SSE, and with an isolated worker the frames it reads; the rest is the worker's). On a
machine shared with other work that figure is far steadier than tokens per second, which drop
whenever another process takes the cores; ``best`` is the round with the most tokens per second,
the nearest to what a quiet machine gives, and the load line says how often a task waited for a
CPU during the last minute (Linux's ``/proc/pressure/cpu``).

    python plugins/anyformer-llamacpp/bench/bench_serve.py [--rounds 3] [--threads 1] [--parallel 4]
        [--clients 4] [--in-process] [--only SUBSTRING ...]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
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
from pathlib import Path

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how rain forms, step by step.",
    "List ten fruits and describe each one.",
    "Describe a walk through a busy city market.",
    "Tell me about the history of the bicycle.",
    "Write a poem about autumn leaves.",
    "How does a refrigerator keep food cold?",
    "Describe the planets of the solar system.",
]
CLIENTS = (1, 4, 8)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _cpu_seconds(root: int) -> tuple[float, float]:
    """User and system CPU seconds of process ``root`` alone, and of it with every process under it, from ``/proc``."""
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it ended meanwhile
        # After the command name: state, ppid, ... utime (11th) and stime (12th).
        pid, ppid = int(entry), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        times[pid] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0.0)
        todo.extend(children.get(pid, ()))
    return times.get(root, 0.0), total


@contextlib.contextmanager
def _server(command: list[str], port: int, env: dict[str, str]) -> Iterator[int]:
    """Run a server until the block ends (its pid is yielded); ready once ``/v1/models`` answers."""
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                connection.request("GET", "/v1/models")
                if connection.getresponse().status == 200:
                    break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{' '.join(command[:3])} did not start")
            time.sleep(0.2)
        yield process.pid
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _stream_once(port: int, model: str, prompt: str, max_tokens: int) -> tuple[float, int]:
    """One streamed chat completion: (seconds to the first content, content chunks)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    started = time.perf_counter()
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
    first = None
    chunks = 0
    for raw in response:
        line = raw.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices") or ():
            if (choice.get("delta") or {}).get("content"):
                first = first if first is not None else time.perf_counter() - started
                chunks += 1
    connection.close()
    return (first if first is not None else float("nan")), chunks


def _load(port: int, pid: int, model: str, clients: int, requests: int, max_tokens: int) -> dict[str, float]:
    """``clients`` streaming at once: aggregate tokens per second over the wall time, TTFT percentiles, and
    the server's (``pid`` and the processes under it) CPU milliseconds per generated token."""
    results: list[tuple[float, int]] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        for turn in range(requests):
            outcome = _stream_once(port, model, PROMPTS[(index + turn) % len(PROMPTS)], max_tokens)
            with lock:
                results.append(outcome)

    cpu_before = _cpu_seconds(pid)
    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    cpu_after = _cpu_seconds(pid)
    own, cpu = (after - before for after, before in zip(cpu_after, cpu_before, strict=True))
    ttfts = sorted(r[0] for r in results)
    tokens = sum(r[1] for r in results)
    return {
        "tok_per_sec": tokens / wall,
        "cpu_ms_per_tok": 1000 * cpu / max(tokens, 1),
        "server_cpu_ms_per_tok": 1000 * own / max(tokens, 1),
        "ttft_p50": statistics.median(ttfts),
        "ttft_p99": ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))],
    }


def _llama_server(explicit: str | None) -> str | None:
    """The llama-server binary to compare with: the one named, else the newest in the wheelhouse's tools."""
    if explicit:
        return explicit
    home = Path(os.environ.get("ANYFORMER_WHEELHOUSE", Path.home() / ".cache" / "anyformer-wheelhouse"))
    found = [p for p in glob.glob(str(home / "llama-cpp-tools-*" / "**" / "llama-server"), recursive=True)]
    found = [p for p in found if os.access(p, os.X_OK) and ".tmp." not in p]
    return max(found, key=os.path.getmtime) if found else None


def _has_llama_cpp_server() -> bool:
    probe = "import fastapi, sse_starlette, starlette_context, pydantic_settings, llama_cpp.server"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def _load_average() -> str:
    """The 1, 5 and 15 minute load averages (other work on a shared machine), and where the kernel reports
    it, the share of the last 60 s in which some task waited for a CPU (``/proc/pressure/cpu``)."""
    averages = " ".join(f"{value:.1f}" for value in os.getloadavg())
    try:
        with open("/proc/pressure/cpu", encoding="ascii") as pressure:
            some = pressure.readline().split()
        waited = dict(field.split("=") for field in some[1:])["avg60"]
        return f"{averages} (CPU waited {waited} %)"
    except (OSError, KeyError, ValueError):
        return averages


def main() -> None:
    """Run every server in alternating rounds and print the medians and the batched/serialised ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2, help="requests per client, one after another")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--context", type=int, default=1024, help="context per stream")
    parser.add_argument("--parallel", type=int, default=4, help="streams per model of the batched servers")
    parser.add_argument("--threads", type=int, help="decode threads for every server (default: every usable core)")
    parser.add_argument("--llama-server", help="path of llama.cpp's llama-server binary")
    parser.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS), help="concurrent clients per load")
    parser.add_argument(
        "--in-process", action="store_true", help="also run the batched server with its engine in-process"
    )
    parser.add_argument("--only", nargs="+", help="run only the servers whose name holds one of these strings")
    args = parser.parse_args()
    clients_list = tuple(args.clients)

    import anyformer
    from anyformer.plugin import usable_cpu_count

    model = str(anyformer.default_model_path())
    threads = str(args.threads or usable_cpu_count())
    env = {**os.environ, "ANYFORMER_LLAMACPP_THREADS": threads}
    port = _free_port()

    def anyformer_serve(parallel: int, *more: str) -> list[str]:
        command = [sys.executable, "-m", "anyformer", "serve", "--port", str(port), "--preload", model]
        return [*command, "--context", str(args.context), "--parallel", str(parallel), *more]

    servers = {
        "anyformer --parallel 1": anyformer_serve(1),
        f"anyformer --parallel {args.parallel}": anyformer_serve(args.parallel),
    }
    if args.in_process:
        servers[f"anyformer --parallel {args.parallel} --in-process"] = anyformer_serve(args.parallel, "--in-process")
    notes = []
    if _has_llama_cpp_server():
        servers["llama_cpp.server"] = [
            *(sys.executable, "-m", "llama_cpp.server", "--model", model, "--model_alias", model),
            *("--port", str(port), "--n_ctx", str(args.context), "--n_threads", threads),
            *("--n_threads_batch", threads, "--interrupt_requests", "False"),
        ]
    else:
        notes.append("llama_cpp.server: not installed (pip install 'llama-cpp-python[server]'); left out")
    binary = _llama_server(args.llama_server)
    if binary is not None:
        servers[f"llama-server --parallel {args.parallel}"] = [
            *(binary, "-m", model, "--alias", model, "--port", str(port), "-t", threads, "-tb", threads),
            *("-c", str(args.context * args.parallel), "--parallel", str(args.parallel), "--cont-batching"),
        ]
    else:
        notes.append("llama-server: no build found under the wheelhouse's llama-cpp-tools-*; left out")
    if args.only:
        servers = {name: command for name, command in servers.items() if any(part in name for part in args.only)}

    figures: dict[tuple[str, int], list[dict[str, float]]] = {}
    load_before = _load_average()
    for _round in range(args.rounds):
        for name, command in servers.items():
            with _server(command, port, env) as pid:
                _stream_once(port, model, PROMPTS[0], 8)  # warm up: first evaluation, caches
                for clients in clients_list:
                    outcome = _load(port, pid, model, clients, args.requests, args.max_tokens)
                    figures.setdefault((name, clients), []).append(outcome)

    def median(name: str, clients: int, key: str) -> float:
        return statistics.median(f[key] for f in figures[(name, clients)])

    print(
        f"SmolLM2-135M-Instruct Q4_1, {threads} threads, {args.requests} requests × {args.max_tokens} max tokens "
        f"per client, context {args.context} per stream, medians of {args.rounds} rounds"
    )
    print(f"load average before / after: {load_before} / {_load_average()}")
    print(
        f"{'server':40} {'clients':>7} {'tok/s':>8} {'best':>6} {'TTFT p50':>9} {'TTFT p99':>9} {'CPU ms/tok':>10} "
        f"{'server ms':>9}"
    )
    for name in servers:
        for clients in clients_list:
            print(
                f"{name:40} {clients:7d} {median(name, clients, 'tok_per_sec'):8.1f} "
                f"{max(f['tok_per_sec'] for f in figures[(name, clients)]):6.1f} "
                f"{median(name, clients, 'ttft_p50') * 1000:7.0f}ms {median(name, clients, 'ttft_p99') * 1000:7.0f}ms "
                f"{median(name, clients, 'cpu_ms_per_tok'):10.2f} {median(name, clients, 'server_cpu_ms_per_tok'):9.2f}"
            )
    serial, batched = "anyformer --parallel 1", f"anyformer --parallel {args.parallel}"
    peer = f"llama-server --parallel {args.parallel}"
    for clients in clients_list:
        if serial in servers and batched in servers:
            gain = median(batched, clients, "tok_per_sec") / median(serial, clients, "tok_per_sec")
            target = " (target ≥ 1.6)" if clients == 4 else ""
            print(f"{clients} clients: batched / serialised aggregate tok/s {gain:.2f}{target}")
    for name in (batched, f"{batched} --in-process"):
        if name not in servers or peer not in servers:
            continue
        for clients in clients_list:
            ratio = median(name, clients, "tok_per_sec") / median(peer, clients, "tok_per_sec")
            cpu = median(name, clients, "cpu_ms_per_tok") / median(peer, clients, "cpu_ms_per_tok")
            print(
                f"{clients} clients: {name} / llama-server aggregate tok/s {ratio:.2f} (target ≥ 0.90), "
                f"CPU per token {cpu:.2f}×"
            )
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
