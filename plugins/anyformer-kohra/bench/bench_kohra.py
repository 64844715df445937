"""kohra's speed in one run: model calls per token with and without ddpm_cache, the cacheless BD3LM path,
the torch reference sampler, and tok/s against the onnx back end's autoregressive decode.

One run, one machine, one model size throughout (``--hidden``, ``--layers``; random weights):

1. Sampler level (kohra's sampler and graph runner, no streaming): a random DiT exported as an MDLM
   graph (bidirectional, no time input, so the cache applies), as a BD3LM graph with a key/value
   cache, and as a BD3LM graph with a 4-D attention mask and no cache (same weights: the recompute
   path). The key/value graph fed one token at a time is an autoregressive decoder of the same size.
2. Reference: the torch port of the MDLM / BD3LM reference sampler (tests/reference_sampler.py) on
   the torch model with the same weights and settings; kohra's speed is given as a ratio to it.
3. End to end through ``anyformer.load``: kohra on the MDLM and BD3LM repos against the onnx back
   end (``anyformer-onnx``, which must be installed) decoding a random Llama of the same hidden
   size, layers and heads, greedy, the same number of tokens.

Every timing is the best of ``--repeats`` runs after a warm-up. Tables 1 and 2 run onnxruntime and
torch on ``--threads`` threads (default 1); table 3 uses each back end's own default.

    python plugins/anyformer-kohra/bench/bench_kohra.py [--tokens 64] [--hidden 256] [--layers 4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny_diffusion
from kohra_fixtures import MASK_ID, READABLE, VOCAB, write_repo
from llama_repo import write_llama_repo
from reference_sampler import bd3lm_sample, mdlm_sample

import anyformer
from anyformer_kohra.denoiser import (
    CachedBlockDenoiser,
    FullSequenceDenoiser,
    GraphRunner,
    RecomputedBlockDenoiser,
    inspect_graph,
)
from anyformer_kohra.ort_session import open_session
from anyformer_kohra.sampler import SamplerSettings, block_steps, sample_blocks, sample_mdlm

PROMPT = np.array([257, 72, 105, 33, 258, 10, 257, 97, 10], dtype=np.int64)
HELLO = [{"role": "user", "content": "Hi!"}]


def _graph(folder: Path, name: str, config: tiny_diffusion.TinyConfig, threads: int) -> GraphRunner:
    path = folder / f"{name}.onnx"
    tiny_diffusion.export_onnx(tiny_diffusion.TinyDiffusionLM(config), str(path))
    session, _ = open_session(path, threads=threads)
    return GraphRunner(session, inspect_graph(session, {}))


def _timed(run: Callable[[], int], repeats: int) -> tuple[float, int]:
    """Best wall time of ``repeats`` runs after a warm-up, and the count one run returns (calls or tokens)."""
    run()
    best, count = float("inf"), 0
    for _ in range(repeats):
        start = time.perf_counter()
        count = run()
        best = min(best, time.perf_counter() - start)
    return best, count


def _autoregressive(runner: GraphRunner, tokens: int) -> int:
    before = runner.calls
    logits, cache = runner.run(PROMPT, 0.0, None)
    for _ in range(tokens):
        row = logits[-1].copy()
        row[MASK_ID] = -np.inf
        token = np.array([int(np.argmax(row))])
        logits, cache = runner.run(token, 0.0, cache)
    return runner.calls - before


def _line(label: str, *cells: str) -> None:
    print(f"{label:62} " + " ".join(f"{c:>9}" for c in cells), flush=True)


def _sampler_table(
    tmp: Path, n: int, block: int, repeats: int, configs: dict[str, tiny_diffusion.TinyConfig], threads: int
) -> dict[str, float]:
    """Print the sampler-level table (calls and tok/s vs the AR decode); return tok/s by row label."""
    mdlm = _graph(tmp, "mdlm", configs["mdlm"], threads)
    kv = _graph(tmp, "kv", configs["kv"], threads)
    masked = _graph(tmp, "mask", configs["mask"], threads)
    _line("\nsampler level", "calls", "calls/tok", "tok/s", "vs AR")
    ar_seconds, ar_calls = _timed(lambda: _autoregressive(kv, n), repeats)
    ar_rate = n / ar_seconds
    rates: dict[str, float] = {}

    def report(label: str, seconds: float, calls: int) -> None:
        rates[label] = n / seconds
        _line(label, str(calls), f"{calls / n:.2f}", f"{n / seconds:.1f}", f"{n / seconds / ar_rate:.2f}x")

    report("autoregressive decode (kohra's runner, kv graph)", ar_seconds, ar_calls)
    for steps in (n, 4 * n):
        for method in ("ancestral", "confidence"):
            for cache in (False, True):
                settings = SamplerSettings(MASK_ID, steps, method, temperature=1.0, seed=0, cache=cache)

                def run(settings: SamplerSettings = settings) -> int:
                    return list(sample_mdlm(FullSequenceDenoiser(mdlm, PROMPT), n, settings))[-1].model_calls

                report(f"MDLM {method} steps={steps} cache={'on' if cache else 'off'}", *_timed(run, repeats))
    for name, runner, denoiser in (
        ("kv cache", kv, CachedBlockDenoiser),
        ("recompute", masked, RecomputedBlockDenoiser),
    ):
        for cache in (False, True):
            settings = SamplerSettings(MASK_ID, n, "ancestral", 1.0, 0, cache=cache, block_size=block)

            def run_blocks(settings: SamplerSettings = settings, runner=runner, denoiser=denoiser) -> int:  # type: ignore[no-untyped-def]
                return list(sample_blocks(denoiser(runner, PROMPT), n, settings))[-1].model_calls

            label = f"BD3LM {name} block={block} steps={n} cache={'on' if cache else 'off'}"
            report(label, *_timed(run_blocks, repeats))
    return rates


def _reference_table(
    n: int,
    block: int,
    repeats: int,
    configs: dict[str, tiny_diffusion.TinyConfig],
    kohra: dict[str, float],
    threads: int,
) -> None:
    """Print the torch reference sampler's tok/s and kohra's (cache off: the same model calls) as a ratio."""
    import torch

    torch.set_num_threads(threads)
    mdlm = tiny_diffusion.TinyDiffusionLM(configs["mdlm"]).eval()
    kv = tiny_diffusion.TinyDiffusionLM(configs["kv"]).eval()
    prompt = PROMPT.tolist()
    _line("\nagainst the torch reference sampler (same settings)", "tok/s", "kohra is")
    for steps in (n, 4 * n):
        seconds, _ = _timed(lambda steps=steps: len(mdlm_sample(mdlm, prompt, n, steps, MASK_ID, 0)), repeats)  # type: ignore[misc]
        ours = kohra[f"MDLM ancestral steps={steps} cache=off"]
        _line(f"reference MDLM ancestral steps={steps} (torch)", f"{n / seconds:.1f}", f"{ours * seconds / n:.2f}x")
    per_block = block_steps(n, n, block)
    seconds, _ = _timed(lambda: len(bd3lm_sample(kv, prompt, n, per_block, block, MASK_ID, 0)), repeats)
    ours = kohra[f"BD3LM kv cache block={block} steps={n} cache=off"]
    _line(
        f"reference BD3LM kv cache block={block} steps={n} (torch)", f"{n / seconds:.1f}", f"{ours * seconds / n:.2f}x"
    )


def _end_to_end_table(
    tmp: Path, n: int, repeats: int, args: argparse.Namespace, configs: dict[str, tiny_diffusion.TinyConfig]
) -> None:
    """Print tok/s through anyformer.load: kohra's repos against the onnx back end's greedy decode."""
    repos = {}
    for name, config, blocks in (("mdlm", configs["mdlm"], False), ("bd3lm", configs["kv"], True)):
        repos[name] = tmp / f"repo-{name}"
        repos[name].mkdir()
        write_repo(repos[name], config, blocks=blocks)
    llama = write_llama_repo(tmp / "repo-llama", hidden=args.hidden, layers=args.layers, heads=configs["kv"].heads)
    _line("\nend to end, anyformer.load", "tokens", "tok/s", "vs onnx")
    sampled = {"temperature": 1.0, "seed": 0}
    onnx_rate = 0.0
    for label, folder, backend, options in (
        ("onnx back end, autoregressive greedy (random Llama)", llama, "onnx", {}),
        ("kohra MDLM ancestral steps=max_new_tokens", repos["mdlm"], "kohra", sampled),
        (f"kohra BD3LM kv cache block={args.block}", repos["bd3lm"], "kohra", sampled),
    ):
        with anyformer.load(str(folder), backend=backend) as model:

            def run(model=model, options=options) -> int:  # type: ignore[no-untyped-def]
                return model.complete(HELLO, max_new_tokens=n, **options).tokens

            seconds, tokens = _timed(run, repeats)
        rate = tokens / seconds
        onnx_rate = onnx_rate or rate
        _line(label, str(tokens), f"{rate:.1f}", f"{rate / onnx_rate:.2f}x")


def main() -> None:
    """Print the three tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--block", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    # One thread by default: on a shared machine torch's multi-threaded runs are erratic (20 s where one
    # thread takes 1 s), and the sampler-level and reference tables must give both engines the same.
    parser.add_argument("--threads", type=int, default=1, help="threads for the sampler and reference tables")
    args = parser.parse_args()
    n = args.tokens
    shape = {
        "hidden": args.hidden,
        "layers": args.layers,
        "heads": max(1, args.hidden // 64),
        "readable": READABLE,
        "no_specials": True,
    }
    configs = {
        "mdlm": tiny_diffusion.TinyConfig(VOCAB, seed=1, **shape),  # type: ignore[arg-type]
        "kv": tiny_diffusion.TinyConfig(VOCAB, kv_cache=True, seed=1, **shape),  # type: ignore[arg-type]
        "mask": tiny_diffusion.TinyConfig(VOCAB, mask_input=True, seed=1, **shape),  # type: ignore[arg-type]
    }
    print(f"{n} tokens, hidden {args.hidden}, {args.layers} layers, vocab {VOCAB}, prompt {len(PROMPT)} tokens")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        kohra = _sampler_table(tmp, n, args.block, args.repeats, configs, args.threads)
        _reference_table(n, args.block, args.repeats, configs, kohra, args.threads)
        _end_to_end_table(tmp, n, args.repeats, args, configs)


if __name__ == "__main__":
    main()
