"""Time to first token with a shared system prompt and a new question each round, against llama-cpp-python.

A chat client or a server sends the same system prompt (and earlier turns) with every question, so
what matters is how much of the prompt is evaluated again. Both sides run in this process on the
same GGUF with the same ``Llama`` settings (context, threads, batch), interleaved round by round,
the order alternating:
- the reference: ``Llama.create_chat_completion(messages, max_tokens=1)`` (llama-cpp-python keeps
  the longest cached prefix);
- anyformer: ``Loaded.generate(messages, max_new_tokens=1)`` up to its first chunk (in-process).
Each is timed from the call to the first token. Two system prompts: ~40 and ~1,000 tokens. The first
round (nothing cached yet) is reported apart; the median of the later rounds is the figure.

    python plugins/anyformer-llamacpp/bench/bench_ttft.py [--rounds 9] [--model PATH] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import llama_cpp  # imported before numpy (see anyformer_llamacpp/engine.py)

import anyformer

CONTEXT = 2048
SHORT_SYSTEM = (
    "You are a helpful assistant at a maritime museum. Answer visitors' questions in one short sentence, "
    "and say so when you do not know."
)
_RULES = [
    "Tickets are checked at the main door and are valid for the whole day.",
    "The lighthouse gallery closes thirty minutes before the museum.",
    "Children under twelve visit the engine room with an adult.",
    "Photographs without flash are welcome in every hall except the map room.",
    "The cafe on the quay serves lunch from noon until three.",
    "Guided tours of the tall ship start every hour from the east pier.",
    "Lost property is kept at the information desk for one month.",
    "The library holds ship logs from 1780 to 1950; ask the librarian for access.",
]
LONG_SYSTEM = (
    SHORT_SYSTEM
    + " Here is what you know about the museum.\n"
    + "\n".join(f"{i + 1}. {_RULES[i % len(_RULES)]} (note {i + 1})" for i in range(52))
)
QUESTIONS = [
    "When does the lighthouse gallery close?",
    "Can I take photos in the map room?",
    "Where do the tours start?",
    "Is there somewhere to eat lunch?",
    "What years do the ship logs cover?",
    "Can my eight-year-old see the engine room alone?",
    "Where is lost property kept?",
    "How long is a ticket valid?",
    "Who do I ask about the library?",
    "Is the cafe open at four?",
    "What is in the engine room?",
    "Do tours leave from the west pier?",
    "Can I use a flash in the main hall?",
    "How long is lost property kept?",
]


def _reference_ttft(llama: Any, messages: list[dict[str, str]]) -> float:
    start = time.perf_counter()
    llama.create_chat_completion(messages, max_tokens=1, temperature=0.0)
    return time.perf_counter() - start


def _anyformer_ttft(loaded: anyformer.Loaded, messages: list[dict[str, str]]) -> float:
    start = time.perf_counter()
    stream = loaded.generate(messages, max_new_tokens=1)
    next(iter(stream))
    elapsed = time.perf_counter() - start
    stream.close()
    return elapsed


def run(path: str, threads: int, system: str, rounds: int) -> tuple[float, float]:
    """The medians (reference, anyformer) in seconds after the first round; prints every figure."""
    reference = llama_cpp.Llama(
        model_path=path,
        n_ctx=CONTEXT,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=min(512, CONTEXT),
        verbose=False,
    )
    loaded = anyformer.load(path, backend="llamacpp", context=CONTEXT, options={"threads": threads})
    prompt = len(loaded.handle.prompt_tokens([{"role": "system", "content": system}], False))
    ref_times: list[float] = []
    our_times: list[float] = []
    try:
        for index in range(rounds + 1):
            messages = [{"role": "system", "content": system}, {"role": "user", "content": QUESTIONS[index]}]
            if index % 2:
                ours, ref = _anyformer_ttft(loaded, messages), _reference_ttft(reference, messages)
            else:
                ref, ours = _reference_ttft(reference, messages), _anyformer_ttft(loaded, messages)
            if index == 0:
                print(
                    f"  system prompt ~{prompt} tokens; first round (cold): {ref * 1000:.0f} ms reference, "
                    f"{ours * 1000:.0f} ms anyformer"
                )
                continue
            ref_times.append(ref)
            our_times.append(ours)
    finally:
        loaded.dispose()
        reference.close()
    ref_median, our_median = statistics.median(ref_times), statistics.median(our_times)
    paired = statistics.median(o / r for o, r in zip(our_times, ref_times, strict=True))
    print(
        f"  new question each round, median of {rounds}: reference {ref_median * 1000:.1f} ms, "
        f"anyformer {our_median * 1000:.1f} ms: {our_median / ref_median:.2f}x (median paired ratio {paired:.2f}x)"
    )
    return ref_median, our_median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a GGUF (default: the embedded SmolLM2)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    if args.rounds + 1 > len(QUESTIONS):
        parser.error(f"--rounds is at most {len(QUESTIONS) - 1}")
    path = args.model or str(anyformer.default_model_path())
    from anyformer_llamacpp.engine import pick_threads

    threads = args.threads or pick_threads()
    print(f"time to first token, {path}, {threads} threads, context {CONTEXT}")
    for name, system in (("short", SHORT_SYSTEM), ("long", LONG_SYSTEM)):
        print(f"{name} system prompt:")
        run(path, threads, system, args.rounds)


if __name__ == "__main__":
    main()
