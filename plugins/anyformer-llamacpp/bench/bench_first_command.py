"""The whole first command, process start to exit: ``anyformer run`` against a plain llama-cpp-python script.

Three commands on the same GGUF, same prompt, 16 new tokens, run in paired rounds (each round runs
all three, in a rotating order, so that load on the machine hits them alike):
- ``anyformer run PROMPT --max-new-tokens 16`` (isolated: the CLI's default);
- the same with ``--in-process``;
- a plain script: ``Llama(model_path=...)`` and ``create_chat_completion(max_tokens=16)``, the
  same context and threads as anyformer picks (``--threads N`` sets both, through
  ``ANYFORMER_LLAMACPP_THREADS``: on a machine shared by many processes one thread is far steadier).
The figure is each command's median wall time over the plain script's (goal: at most 1.3x isolated),
and its median CPU time (user + system, the worker's included) over the plain script's: on a machine
shared with other work, CPU seconds vary far less than wall time.

    python plugins/anyformer-llamacpp/bench/bench_first_command.py [--rounds 7] [--model PATH] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

import anyformer

PROMPT = "What is the capital of France? Answer in one word."

PLAIN_SCRIPT = """\
import sys
from llama_cpp import Llama
llama = Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[2]), n_threads=int(sys.argv[3]),
              n_threads_batch=int(sys.argv[3]), verbose=False)
reply = llama.create_chat_completion([{"role": "user", "content": sys.argv[4]}], max_tokens=16, temperature=0.0)
print(reply["choices"][0]["message"]["content"])
"""


def _cpu_of_children() -> float:
    """User + system seconds of every ended child process and of the processes they waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run ``command``: its wall seconds and its CPU seconds (a worker it waited for included)."""
    cpu = _cpu_of_children()
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    elapsed = time.perf_counter() - start
    cpu = _cpu_of_children() - cpu
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])}... failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a GGUF (default: the embedded SmolLM2)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="threads for both (default: every usable core)")
    args = parser.parse_args()
    path = args.model or str(anyformer.default_model_path())
    from anyformer_llamacpp.engine import pick_threads
    from anyformer_llamacpp.estimate import context_for

    cli = shutil.which("anyformer") or ""
    base = [cli] if cli else [sys.executable, "-m", "anyformer"]
    model_args = [] if args.model is None else [path]
    facts = anyformer.describe(path).metadata.get("gguf") or {}
    threads = args.threads or pick_threads()
    env = {**os.environ, "ANYFORMER_LLAMACPP_THREADS": str(threads)}
    # An installed package has its bytecode compiled (pip does it); an editable checkout gets it from the
    # warm-up run below, unless the shell forbids writing it: then every run compiles ~70 modules anew.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    commands = {
        "anyformer run (isolated)": [*base, "run", *model_args, PROMPT, "--max-new-tokens", "16"],
        "anyformer run --in-process": [*base, "run", *model_args, PROMPT, "--max-new-tokens", "16", "--in-process"],
        "plain llama-cpp-python": [
            sys.executable,
            "-c",
            PLAIN_SCRIPT,
            path,
            str(context_for(facts, None)),
            str(threads),
            PROMPT,
        ],
    }
    names = list(commands)
    times: dict[str, list[float]] = {name: [] for name in names}
    cpu_times: dict[str, list[float]] = {name: [] for name in names}
    for name in names:
        _timed(commands[name], env)  # warm the page cache and the bytecode caches once
    for round_index in range(args.rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name in order:
            wall, cpu = _timed(commands[name], env)
            times[name].append(wall)
            cpu_times[name].append(cpu)
    plain = times["plain llama-cpp-python"]
    plain_cpu = cpu_times["plain llama-cpp-python"]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"whole first command, {path}, {threads} threads, median of {args.rounds} paired rounds "
        f"(load average {load:.2f} at the end):"
    )
    for name in names:
        median = statistics.median(times[name])
        ratio = median / statistics.median(plain)
        paired = statistics.median(t / p for t, p in zip(times[name], plain, strict=True))
        cpu = statistics.median(cpu_times[name])
        cpu_ratio = cpu / statistics.median(plain_cpu)
        print(
            f"  {name:>28}: {median:.3f} s  {ratio:.2f}x plain (paired median {paired:.2f}x);"
            f"  CPU {cpu:.3f} s  {cpu_ratio:.2f}x plain"
        )


if __name__ == "__main__":
    main()
