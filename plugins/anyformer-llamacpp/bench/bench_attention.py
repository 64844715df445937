"""Raw ``llama_decode`` cost per token with flash attention off and on, one sequence and several.

One llama.cpp context of ``--parallel`` sequences, each with a KV region of its own (the batched
engine's ``kv_unified = false``; ``--unified`` for llama-server's shared cache), on the embedded
SmolLM2 (or ``--model``). Each sequence reads a 48-token prompt, then ``--steps`` decode steps
feed every sequence one token in one batch. Reported per generated token: wall time and process
CPU time, for 1 sequence and for all of them, interleaved over ``--rounds`` rounds (medians), so
load from other work hits both settings alike.

    python plugins/anyformer-llamacpp/bench/bench_attention.py [--threads 1] [--parallel 4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import llama_cpp  # imported before numpy (see anyformer_llamacpp/engine.py)

import anyformer


def _context(model, threads: int, parallel: int, flash: bool, unified: bool):  # type: ignore[no-untyped-def]
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = 1024 * parallel
    params.n_batch = params.n_ubatch = 512
    params.n_seq_max = parallel
    params.kv_unified = unified
    params.n_threads = params.n_threads_batch = threads
    params.flash_attn_type = (
        llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    return llama_cpp.llama_init_from_model(model, params)


def _run(ctx, streams: int, steps: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(wall ms, CPU ms) per generated token of ``steps`` steps of ``streams`` sequences."""
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    batch = llama_cpp.llama_batch_init(512, 0, 1)

    def add(token: int, position: int, seq: int) -> None:
        index = batch.n_tokens
        batch.token[index], batch.pos[index], batch.n_seq_id[index] = token, position, 1
        batch.seq_id[index][0], batch.logits[index] = seq, True
        batch.n_tokens = index + 1

    for seq in range(streams):
        batch.n_tokens = 0
        for position in range(48):
            add(100 + (7 * position + seq) % 900, position, seq)
        assert llama_cpp.llama_decode(ctx, batch) == 0
    wall, cpu = time.perf_counter(), time.process_time()
    for step in range(steps):
        batch.n_tokens = 0
        for seq in range(streams):
            add(200 + (step * 13 + seq) % 800, 48 + step, seq)
        assert llama_cpp.llama_decode(ctx, batch) == 0
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    llama_cpp.llama_batch_free(batch)
    return 1000 * wall / (steps * streams), 1000 * cpu / (steps * streams)


def main() -> None:
    """Print the medians of every setting, interleaved round by round."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(anyformer.default_model_path()))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--unified", action="store_true", help="one KV cache for every sequence (llama-server's)")
    args = parser.parse_args()
    llama_cpp.llama_backend_init()
    model_params = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(args.model.encode(), model_params)
    contexts = {flash: _context(model, args.threads, args.parallel, flash, args.unified) for flash in (False, True)}
    figures: dict[tuple[bool, int], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for flash, ctx in contexts.items():
            for streams in (1, args.parallel):
                figures.setdefault((flash, streams), []).append(_run(ctx, streams, args.steps))
    print(f"{args.threads} threads, kv_unified={args.unified}, {args.steps} steps, medians of {args.rounds} rounds")
    print(f"{'flash attention':16} {'sequences':>9} {'wall ms/tok':>11} {'CPU ms/tok':>10}")
    for (flash, streams), runs in figures.items():
        wall = statistics.median(run[0] for run in runs)
        cpu = statistics.median(run[1] for run in runs)
        print(f"{'on' if flash else 'off':16} {streams:9d} {wall:11.2f} {cpu:10.2f}")
    for ctx in contexts.values():
        llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)


if __name__ == "__main__":
    main()
