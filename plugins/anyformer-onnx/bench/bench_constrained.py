"""Decode speed under a JSON-schema constraint against unconstrained decoding on the ONNX backend (issue 30).

The llama.cpp bench's idea (plugins/anyformer-llamacpp/bench/bench_constrained.py) on SmolLM2-135M-Instruct's
fp32 ONNX export (the test fixture, cached): rounds alternate the same prompt greedily with no constraint
and under a JSON schema of one long string field, on one loaded model; each side's rate is its tokens
after the first over the time after the first, and the figure is their ratio, with the mask work per
token (the core's ``TokenMask.masked`` and ``consume``) and the load average before and after.

    python plugins/anyformer-onnx/bench/bench_constrained.py [--rounds 5] [--tokens 128]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import onnx_exports  # the fixtures: the cached export of SmolLM2

import anyformer
from anyformer.plugin import TokenMask

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper who finds a message in a bottle."}]
SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 40}, "story": {"type": "string", "minLength": 4000}},
    "required": ["title", "story"],
}


def _clocked() -> dict[str, float]:
    """Time TokenMask.masked and consume from now on; the returned dict adds up their seconds and steps."""
    clock = {"seconds": 0.0, "steps": 0.0}
    masked, consume = TokenMask.masked, TokenMask.consume

    def timed_masked(this: Any, logits: Any) -> Any:
        start = time.perf_counter()
        row = masked(this, logits)
        clock["seconds"] += time.perf_counter() - start
        clock["steps"] += 1
        return row

    def timed_consume(this: Any, token: int) -> None:
        start = time.perf_counter()
        consume(this, token)
        clock["seconds"] += time.perf_counter() - start

    TokenMask.masked, TokenMask.consume = timed_masked, timed_consume  # type: ignore[method-assign]
    return clock


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
    args = parser.parse_args()
    print("load average before: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    clock = _clocked()
    free_rates, held_rates, mask_per_token = [], [], []
    with anyformer.load(str(onnx_exports.smollm2()), backend="onnx") as loaded:
        constraint = {"type": "json_schema", "schema": SCHEMA}
        _decode_rate(loaded, 8, constraint=constraint)  # builds the vocabulary once, not timed
        for round_ in range(args.rounds):
            clock.update(seconds=0.0, steps=0.0)
            free, free_count = _decode_rate(loaded, args.tokens)
            held, held_count = _decode_rate(loaded, args.tokens, constraint=constraint)
            mask = clock["seconds"] / max(clock["steps"], 1)
            free_rates.append(free)
            held_rates.append(held)
            mask_per_token.append(mask)
            print(
                f"round {round_ + 1}: free {free:.1f} tok/s ({free_count} tokens), "
                f"constrained {held:.1f} tok/s ({held_count} tokens), mask {mask * 1e6:.0f} us/token"
            )
    free, held, mask = (statistics.median(v) for v in (free_rates, held_rates, mask_per_token))
    print(f"\nmedian: free {free:.1f} tok/s, constrained {held:.1f} tok/s, ratio {held / free:.3f}")
    print(f"mask work {mask * 1e6:.0f} us a token = {mask * free * 100:.1f} % of a free token's {1e3 / free:.2f} ms")
    print("load average after: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
