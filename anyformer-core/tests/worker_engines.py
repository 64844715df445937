"""Test backends that misbehave the way native engines do: abort, segfault, exit, run out of memory.

Each module-level object is one backend; the tests register them as entry points of a distribution
on ``sys.path`` (an isolated worker loads backends from entry points only, and takes the parent's
``sys.path``, so it imports this very module). Faults strike at the third token, or at load.
``run("stats")`` reports what the engine did, from inside the worker.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from anyformer import AnyformerError, Chunk, Estimate, ProgressEvent, Rank, Verdict, hookimpl
from anyformer.plugin import BackendModel, Features, render_chat

#: What glibc's C++ runtime prints when ``new`` fails and nothing catches it.
BAD_ALLOC = "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc\n"


class Handle(BackendModel):
    """A loaded model of :class:`Engine`: counts what the engine did; its generation is the engine's."""

    def __init__(self, engine: Engine, parallel: int = 1, audio_input: bool = False) -> None:
        self.engine = engine
        self.backend = engine.name
        self.task = "text-generation"
        self.parallel = parallel
        self.features = Features(parallel=parallel, audio_input=audio_input)
        self.made = 0
        self.closed = 0
        self.disposed = 0
        self.live = 0  # streams running now, and the most that ever ran at once
        self.peak = 0
        self._count = threading.Lock()

    def enter(self) -> None:
        with self._count:
            self.live += 1
            self.peak = max(self.peak, self.live)

    def leave(self) -> None:
        with self._count:
            self.live -= 1
            self.closed += 1

    def generate(self, messages: list[Any], options: Any) -> Iterator[Chunk]:
        return self.engine.generate_on(self, messages, options)

    def run(self, input: Any, **options: Any) -> Any:
        if input == "stats":
            return {"made": self.made, "closed": self.closed, "peak": self.peak, "pid": os.getpid()}
        if input == "cached headers":  # the GGUF headers this process holds without having read them here
            from anyformer.files import _gguf_header

            return [identity[0] for identity in _gguf_header._HEADER_CACHE]
        if input == "sleep":  # a run long enough for a cancel to arrive while it works
            time.sleep(0.4)
        return {"input": input, "options": options}

    def dispose(self) -> None:
        self.disposed += 1


class ProgressHandle(Handle):
    """A handle whose ``run`` declares ``run_progress``: ``{"units": n}`` works through n units, reporting each."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.features = Features(run_progress=True)
        self.task = "feature-extraction"
        self.units = 0  # units of work done, over every run

    def run(self, input: Any, progress: Any = None, **options: Any) -> Any:
        if not isinstance(input, dict):
            return {**super().run(input, **options), "units": self.units}
        total = int(input["units"])
        done = []
        for unit in range(total):
            time.sleep(float(input.get("delay", 0.0)))
            done.append(unit)
            self.units += 1
            if input.get("malformed"):
                progress((unit + 1, total))  # a backend bug: not a ProgressEvent
            progress(ProgressEvent(stage="units", done=unit + 1, total=total))
        return {"done": done}


def _die_of(fault: str) -> None:
    sys.stderr.write(f"engine: about to {fault}\n")
    sys.stderr.flush()
    if fault == "abort":
        os.abort()
    elif fault == "segfault":
        ctypes.string_at(0)
    elif fault == "exit":
        os._exit(7)
    elif fault == "bad_alloc":
        sys.stderr.write(BAD_ALLOC)
        sys.stderr.flush()
        os.abort()
    elif fault == "cuda_oom":
        sys.stderr.write("CUDA error: out of memory\n  current device: 0, in function ggml_cuda_op\n")
        sys.stderr.flush()
        os.abort()


#: A template that opens ``<think>`` in the prompt when thinking is on (Qwen3's later templates, DeepSeek-R1).
THINKING_TEMPLATE = (
    "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking %}<think>\n{% endif %}{% endif %}"
)


class Engine:
    """One backend: ``fault`` names what goes wrong and ``at`` when (``load`` or ``generate``)."""

    def __init__(
        self,
        name: str,
        fault: str | None = None,
        at: str = "generate",
        delay: float = 0.0,
        parallel: int = 1,
        audio_input: bool = False,
        run_progress: bool = False,
    ) -> None:
        self.name = name
        self.run_progress = run_progress  # its handles report run()'s progress and stop when cancelled
        self.fault = fault
        self.at = at
        self.delay = delay
        self.parallel = parallel
        self.audio_input = audio_input  # its handles read audio blocks

    @hookimpl
    def can_run(self, model: Any) -> Verdict:
        return Verdict.accept(self.name, Estimate(ram_bytes=10**6, tok_per_sec=10.0, rank=Rank.GENERAL))

    @hookimpl
    def load(self, model: Any, progress: Any) -> Handle:
        progress(ProgressEvent(stage="load", backend=self.name, file="weights", done=0, total=2))
        if self.at == "load":
            if self.fault == "bad_model":
                raise AnyformerError("BAD_MODEL", "weights: tensor blk.0.attn_q has the wrong shape")
            if self.fault == "raises":
                raise KeyError("blk.0.attn_q")
            _die_of(self.fault or "")
        progress(ProgressEvent(stage="load", backend=self.name, file="weights", done=2, total=2))
        if self.run_progress:
            return ProgressHandle(self)
        return Handle(self, self.parallel, self.audio_input)

    def generate_on(self, loaded: Handle, messages: list[Any], options: Any) -> Iterator[Chunk]:
        if self.fault == "bad_request":
            raise AnyformerError("BAD_REQUEST", "the prompt is 9000 tokens and the context is 512")
        if self.fault == "echo":
            return iter([Chunk(delta=repr(messages), tokens=1, finish_reason="stop")])
        if self.fault == "spin":  # a template or a prompt evaluation that never returns, deaf to cancel
            while True:
                pass
        # A backend serving several streams writes each reply's words with its prompt's first letter.
        word = "w"
        if self.parallel > 1 and messages and isinstance(messages[-1]["content"], str):
            word = messages[-1]["content"][:1] or "w"
        return self._stream(loaded, options, word)

    def _stream(self, handle: Handle, options: Any, word: str) -> Iterator[Chunk]:
        if self.fault == "thinks":  # renders, at its first token, a template that opens <think> in the prompt
            render_chat(THINKING_TEMPLATE, [{"role": "user", "content": "hi"}], enable_thinking=options.thinking)
        handle.enter()
        try:
            token = 0
            while not options.cancel.is_set():
                token += 1
                if token == 3 and self.at == "generate" and self.fault:
                    if self.fault == "raises":
                        raise KeyError("kv slot")
                    if self.fault == "prints":
                        print("engine chatter on stdout")
                        os.write(1, b"\x00\x00\x00\x05{bad}")  # would corrupt a frame if fd 1 were the pipe
                    else:
                        _die_of(self.fault)
                if self.delay:
                    time.sleep(self.delay)
                handle.made += 1
                # "previews" also shows what it might say next, as a text-diffusion backend does.
                preview = f"w{token} w{token + 1}?" if self.fault == "previews" else None
                yield Chunk(delta=f"{word}{token} ", tokens=token, preview=preview)
            yield Chunk(tokens=token, finish_reason="cancelled")
        finally:
            handle.leave()


steady = Engine("steady")
#: Its run() reports each unit of work and stops between units when cancelled.
counts = Engine("counts", run_progress=True)
slow = Engine("slow", delay=0.01)
#: Serves three streams at once (``parallel = 3``), each reply written with its prompt's first letter.
triple = Engine("triple", delay=0.002, parallel=3)
echo = Engine("echo", "echo", audio_input=True)
previews = Engine("previews", "previews")
aborts = Engine("aborts", "abort")
segfaults = Engine("segfaults", "segfault")
exits = Engine("exits", "exit")
bad_alloc = Engine("bad-alloc", "bad_alloc")
cuda_oom = Engine("cuda-oom", "cuda_oom")
raises = Engine("raises", "raises")
#: Renders a template that opens ``<think>`` when thinking is on, at its first token (a lazy render).
thinks = Engine("thinks", "thinks")
prints = Engine("prints", "prints")
bad_request = Engine("bad-request", "bad_request")
spins = Engine("spins", "spin")
aborts_at_load = Engine("aborts-at-load", "abort", at="load")
bad_alloc_at_load = Engine("bad-alloc-at-load", "bad_alloc", at="load")
bad_model_at_load = Engine("bad-model-at-load", "bad_model", at="load")
raises_at_load = Engine("raises-at-load", "raises", at="load")

#: Every backend above: id -> ``module:attribute``.
ENTRY_POINTS = {
    engine.name: f"worker_engines:{attribute}"
    for attribute, engine in dict(globals()).items()
    if isinstance(engine, Engine)
}
