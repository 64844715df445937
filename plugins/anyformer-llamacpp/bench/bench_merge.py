"""A prompt block in the decode step's batch, or in a decode of its own: the same numbers? the time saved?

The batched engine (``_batch.py``) may put the prompt blocks of newly admitted streams into the
same ``llama_decode`` as the decoding streams' tokens, as llama-server does, only where that
leaves every row's numbers as they are. This measures it on one llama.cpp context of 4 sequences
made as the engine makes it (``kv_unified = false``, ``--unified`` for a shared cache), on the
embedded SmolLM2 (or ``--model``):

1. *Numerics*: three sequences have read a chat prompt and decode; the fourth reads a block of
   ``count`` positions from ``first`` (every count from 1 to 32, from 0 and from 32, the block on
   the last and on a middle sequence). Once apart (the decode tokens, then the block) and once
   merged (one batch, sequences ascending), each in a fresh context: every block row's logits,
   every decode row's logits, and the logits of one more token on every sequence (what the cache
   now holds) must be bitwise equal. Also two blocks of one sequence in one batch against two
   decodes.
2. *Time*: one step of 3 decode tokens and a prompt's 15 new positions in two blocks of 8 and 7
   (what bench_serve's prompts re-read once a slot holds another question), apart (3 decodes)
   against merged (1 decode) against the decode tokens alone, interleaved, medians.

    python plugins/anyformer-llamacpp/bench/bench_merge.py [--threads 2] [--flash off] [--unified] [--repeats 40]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from typing import Any

import llama_cpp  # imported before numpy (see anyformer_llamacpp/engine.py)
import numpy as np

import anyformer

QUESTIONS = (
    "Write a short story about a lighthouse keeper and the sea at night.",
    "Explain how rain forms, step by step, for a child of seven.",
    "List ten fruits and describe each one in a sentence or two.",
    "Describe a walk through a busy city market on a hot summer day, with all the smells and sounds.",
)
SYSTEM = (
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face. Answer in plain words and briefly, "
    "and never make up a fact you do not know: say so, and say where it could be found."
)
#: llama.cpp's log goes nowhere (it logs every context it makes).
_QUIET = llama_cpp.llama_log_callback(lambda level, text, data: None)
#: A batch row: (token, position, sequence, logits wanted).
Row = tuple[int, int, int, bool]


class Bench:
    """The model, and fresh contexts made as the batched engine makes them."""

    def __init__(self, args: argparse.Namespace) -> None:
        llama_cpp.llama_log_set(_QUIET, None)
        llama_cpp.llama_backend_init()
        self.model = llama_cpp.llama_model_load_from_file(
            str(args.model or anyformer.default_model_path()).encode(), llama_cpp.llama_model_default_params()
        )
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.args = args
        self.prompts = [self.tokenize(self.chat(question)) for question in QUESTIONS]
        assert min(map(len, self.prompts)) > 65, [
            len(p) for p in self.prompts
        ]  # room for a block of 32 from 32, and one more

    @staticmethod
    def chat(question: str) -> str:
        return (
            f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        )

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        out = (llama_cpp.llama_token * (len(data) + 8))()
        count = llama_cpp.llama_tokenize(self.vocab, data, len(data), out, len(out), True, True)
        return list(out[:count])

    def context(self) -> tuple[Any, Any]:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = 4 * 1024
        params.n_batch = params.n_ubatch = 512
        params.n_seq_max = 4
        params.kv_unified = self.args.unified
        params.n_threads = params.n_threads_batch = self.args.threads
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if self.args.flash == "on"
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        return llama_cpp.llama_init_from_model(self.model, params), llama_cpp.llama_batch_init(512, 0, 1)

    def decode(self, ctx: Any, batch: Any, rows: list[Row]) -> list[np.ndarray]:
        """Decode ``rows`` as one batch; the logits of the rows that want them, in order."""
        for index, (token, position, seq, wanted) in enumerate(rows):
            batch.token[index], batch.pos[index], batch.n_seq_id[index] = token, position, 1
            batch.seq_id[index][0], batch.logits[index] = seq, wanted
        batch.n_tokens = len(rows)
        status = llama_cpp.llama_decode(ctx, batch)
        assert status == 0, status
        pointer = ctypes.POINTER(ctypes.c_float)
        return [
            np.ctypeslib.as_array(
                ctypes.cast(llama_cpp.llama_get_logits_ith(ctx, index), pointer), shape=(self.n_vocab,)
            ).copy()
            for index, row in enumerate(rows)
            if row[3]
        ]


def _one_case(bench: Bench, reader: int, first: int, count: int) -> float:
    """Apart against merged for one block; the largest difference anywhere (0.0: bitwise equal)."""
    results = []
    for merged in (False, True):
        ctx, batch = bench.context()
        following: dict[int, tuple[int, int]] = {}  # each decoding sequence's next token and position
        for seq, prompt in enumerate(bench.prompts):
            if seq == reader:
                if first:
                    bench.decode(ctx, batch, [(t, i, seq, False) for i, t in enumerate(prompt[:first])])
                continue
            logits = bench.decode(ctx, batch, [(t, i, seq, i == len(prompt) - 1) for i, t in enumerate(prompt)])
            following[seq] = (int(np.argmax(logits[0])), len(prompt))
        block = [(t, first + i, reader, True) for i, t in enumerate(bench.prompts[reader][first : first + count])]
        steps = [(token, position, seq, True) for seq, (token, position) in sorted(following.items())]
        if merged:
            rows = sorted(steps + block, key=lambda row: row[2])
            logits = bench.decode(ctx, batch, rows)
            stepped = [lg for lg, row in zip(logits, rows, strict=True) if row[2] != reader]
            read = [lg for lg, row in zip(logits, rows, strict=True) if row[2] == reader]
        else:
            stepped = bench.decode(ctx, batch, steps)
            read = bench.decode(ctx, batch, block)
        after = bench.decode(ctx, batch, [(int(np.argmax(read[-1])), first + count, reader, True)])
        for (_, position, seq, _), logits in zip(steps, stepped, strict=True):
            after += bench.decode(ctx, batch, [(int(np.argmax(logits)), position + 1, seq, True)])
        results.append(np.stack(read + stepped + after))
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
    return float(np.max(np.abs(results[0] - results[1])))


def _two_blocks(bench: Bench, first: int, cut: int, end: int) -> float:
    """Blocks [first, cut) and [cut, end) of one sequence in one batch against two decodes."""
    results = []
    prompt = bench.prompts[3]
    for together in (False, True):
        ctx, batch = bench.context()
        if first:
            bench.decode(ctx, batch, [(t, i, 0, False) for i, t in enumerate(prompt[:first])])
        rows = [(t, first + i, 0, True) for i, t in enumerate(prompt[first:end])]
        split = cut - first
        logits = (
            bench.decode(ctx, batch, rows)
            if together
            else bench.decode(ctx, batch, rows[:split]) + bench.decode(ctx, batch, rows[split:])
        )
        logits += bench.decode(ctx, batch, [(int(np.argmax(logits[-1])), end, 0, True)])
        results.append(np.stack(logits))
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
    return float(np.max(np.abs(results[0] - results[1])))


def _timing(bench: Bench, repeats: int) -> dict[str, float]:
    """Median ms of one step: 3 decode tokens alone, then with blocks of 8 and 7 positions apart and merged."""
    ctx, batch = bench.context()
    memory = llama_cpp.llama_get_memory(ctx)
    for seq, prompt in enumerate(bench.prompts):
        bench.decode(ctx, batch, [(t, i, seq, False) for i, t in enumerate(prompt[:40])])
    times: dict[str, list[float]] = {"decode tokens alone": [], "apart (3 decodes)": [], "merged (1 decode)": []}
    for repeat in range(repeats):
        for name, spent in times.items():
            steps = [(100 + repeat, 40, seq, True) for seq in range(3)]
            block = [(200 + i, 40 + i, 3, i == 14) for i in range(15)]
            start = time.perf_counter()
            if name.startswith("decode"):
                bench.decode(ctx, batch, steps)
            elif name.startswith("apart"):
                bench.decode(ctx, batch, steps)
                bench.decode(ctx, batch, block[:8])
                bench.decode(ctx, batch, block[8:])
            else:
                bench.decode(ctx, batch, steps + block)
            spent.append(time.perf_counter() - start)
            for seq in range(4):
                llama_cpp.llama_memory_seq_rm(memory, seq, 40, -1)
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    return {name: 1000 * statistics.median(spent) for name, spent in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a GGUF (default: the embedded SmolLM2)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--flash", choices=("on", "off"), default="on")
    parser.add_argument("--unified", action="store_true", help="one KV cache for all sequences (llama-server's -kvu)")
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    bench = Bench(args)
    print(f"threads {args.threads}, flash attention {args.flash}, kv_unified {args.unified}")
    differ = []
    cases = [(reader, first, count) for reader in (3, 1) for first in (0, 32) for count in range(1, 33)]
    for reader, first, count in cases:
        largest = _one_case(bench, reader, first, count)
        if largest:
            differ.append(f"seq {reader} [{first},{first + count}): {largest:.3g}")
    print(f"block beside 3 decode tokens vs apart: {len(cases) - len(differ)} of {len(cases)} bitwise equal")
    for line in differ:
        print(f"  differs (max abs logit diff): {line}")
    for first, cut, end in ((0, 8, 32), (32, 40, 47), (32, 47, 64)):
        largest = _two_blocks(bench, first, cut, end)
        print(
            f"blocks [{first},{cut})+[{cut},{end}) in one batch vs two: "
            + ("bitwise equal" if not largest else f"{largest:.3g}")
        )
    for name, ms in _timing(bench, args.repeats).items():
        print(f"{name:>22}: {ms:.2f} ms (median of {args.repeats})")


if __name__ == "__main__":
    main()
