"""Decode speed under a JSON-schema constraint against unconstrained decoding, on the same model (issue 30).

Rounds alternate: the same prompt decoded greedily with no constraint, then under a JSON schema
(one long string field, so the constrained reply runs as long as the free one). Each side's speed
is its decode rate (tokens after the first over the time after the first, so prompt evaluation is
out); the figure is their ratio, and the mask work the stream's thread waits for (llguidance
computing the mask, or waiting for the mask computed ahead while llama_decode ran; applying it;
advancing past each token) per token as a share of a token's time. ``--threads`` sets llama.cpp's
decode threads: fewer than the usable cores leaves one for the mask (``MaskAhead``). The load
average is printed before and after: on a shared machine, compare only runs under the same load.

    python plugins/anyformer-llamacpp/bench/bench_constrained.py [--rounds 5] [--tokens 128] [--threads N]
        [--in-line] [--model PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import llama_cpp  # noqa: F401  imported before numpy (see anyformer_llamacpp/engine.py)

import anyformer
from anyformer.plugin import TokenMask

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper who finds a message in a bottle."}]
SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 40}, "story": {"type": "string", "minLength": 4000}},
    "required": ["title", "story"],
}


class _MaskClock:
    """Adds up the time spent in the constraint's mask work (``TokenMask.masked`` and ``consume``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.steps = 0
        self._masked, self._consume = TokenMask.masked, TokenMask.consume
        clock = self

        def masked(this: Any, logits: Any) -> Any:
            start = time.perf_counter()
            row = clock._masked(this, logits)
            clock.seconds += time.perf_counter() - start
            clock.steps += 1
            return row

        def consume(this: Any, token: int) -> None:
            start = time.perf_counter()
            clock._consume(this, token)
            clock.seconds += time.perf_counter() - start

        TokenMask.masked, TokenMask.consume = masked, consume  # type: ignore[method-assign]

    def lap(self) -> tuple[float, int]:
        seconds, steps, self.seconds, self.steps = self.seconds, self.steps, 0.0, 0
        return seconds, steps


def _decode_rate(loaded: anyformer.Loaded, tokens: int, **options: Any) -> tuple[float, int]:
    """Tokens a second after the first, and the tokens generated."""
    first_at = last_at = 0.0
    first_tokens = count = 0
    for chunk in loaded.generate(PROMPT, max_new_tokens=tokens, **options):
        now = time.perf_counter()
        if chunk.tokens and not first_tokens:
            first_at, first_tokens = now, chunk.tokens
        last_at, count = now, chunk.tokens
    return (count - first_tokens) / max(last_at - first_at, 1e-9), count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--model", type=Path, default=None, help="a GGUF (default: the embedded SmolLM2)")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp's decode threads (default: every core)")
    parser.add_argument("--in-line", action="store_true", help="compute each mask in line, even with a core free")
    args = parser.parse_args()
    print("load average before: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    path = args.model or anyformer.default_model_path()
    clock = _MaskClock()
    free_rates, held_rates, mask_per_token = [], [], []
    options = {} if args.threads is None else {"threads": args.threads}
    with anyformer.load(path, backend="llamacpp", options=options) as loaded:
        if args.in_line:
            loaded.handle.mask_ahead.spare_core = False
        ahead = loaded.handle.mask_ahead.spare_core
        where = f"{loaded.handle.gpu_layers} layers on the GPU" if loaded.handle.gpu_layers else "on the CPU"
        threads = loaded.handle._llama.n_threads
        print(f"decode threads {threads}, {where}, mask computed {'ahead' if ahead else 'in line'}")
        constraint = {"type": "json_schema", "schema": SCHEMA}
        _decode_rate(loaded, 8, constraint=constraint)  # builds the vocabulary once (about a second), not timed
        clock.lap()
        for round_ in range(args.rounds):
            free, free_count = _decode_rate(loaded, args.tokens)
            held, held_count = _decode_rate(loaded, args.tokens, constraint=constraint)
            seconds, steps = clock.lap()
            free_rates.append(free)
            held_rates.append(held)
            mask_per_token.append(seconds / max(steps, 1))
            print(
                f"round {round_ + 1}: free {free:.1f} tok/s ({free_count} tokens), "
                f"constrained {held:.1f} tok/s ({held_count} tokens), mask {seconds / max(steps, 1) * 1e6:.0f} us/token"
            )
    free, held, mask = (statistics.median(v) for v in (free_rates, held_rates, mask_per_token))
    print(f"\nmedian: free {free:.1f} tok/s, constrained {held:.1f} tok/s, ratio {held / free:.3f}")
    print(f"mask work {mask * 1e6:.0f} us a token = {mask * free * 100:.1f} % of a free token's {1e3 / free:.2f} ms")
    print("load average after: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
