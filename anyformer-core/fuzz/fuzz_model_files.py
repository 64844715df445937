"""Fuzz the bounded model-file readers and ``anyformer.describe`` with mutated GGUF, safetensors and ONNX bytes.

The first byte of an input picks the format, the rest is the file. Each input goes through the
validator directly (``read_gguf_header`` on the bytes, ``read_safetensors_header``,
``read_onnx_summary`` and ``check_onnx_external_data``) and through ``describe`` on a file written
to disk (an ONNX model gets a 16-byte ``w.bin`` beside it for its external data); a GGUF's chat
template, when its header holds one, is rendered too (under a short render limit). The only outcome
accepted is a return or an ``AnyformerError`` that does not wrap a ``MemoryError`` or
``RecursionError``; anything else, an input taking over 1 s, or an allocation that would pass the
256 MiB allowance over the start-up footprint (``RLIMIT_AS``) is a finding: the input is saved and
the run stops.

Seeds: a tiny llama GGUF written by gguf's writer (with its ChatML template, and twice more with
hostile templates: a loop of 10^10 steps and a doubling to 2 Gi characters), the core tests'
hand-built GGUF, a safetensors file of two tensors, and hand-encoded ONNX models (inline and
external data).

    python anyformer-core/fuzz/fuzz_model_files.py -runs=100000          # atheris, coverage-guided
    python anyformer-core/fuzz/fuzz_model_files.py --random 100000       # no atheris: random mutations
    nox -s fuzz                                                          # the first, installed as users do
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import resource
import signal
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO / "anyformer-core" / "tests"), str(REPO / "plugins" / "anyformer-llamacpp" / "tests")]

#: Formats by the first byte of an input (modulo their number).
FORMATS = ("gguf", "safetensors", "onnx")
#: Wall-clock seconds one input may take.
TIME_LIMIT_SECONDS = 1.0
#: Bytes of address space one input may add to the harness's start-up footprint.
MEMORY_ALLOWANCE = 256 * 2**20
_REPORT_EVERY = 10_000
#: Seconds a GGUF's chat template may render here (its budget's deadline, well inside the input's limit).
TEMPLATE_SECONDS = 0.05
#: Templates that hung a worker or took gigabytes before renders were budgeted; seeds, as GGUFs.
HOSTILE_TEMPLATES = (
    "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}{{ messages[0].content }}",
    "{% set s = 'xxxxxxxx' %}" + "{% set s = s ~ s %}" * 28 + "{{ s }}{{ messages[0].content }}",
)


class Finding(Exception):
    """An input made a reader do something other than return or raise a plain AnyformerError."""


class InputTimeout(BaseException):
    """An input ran over :data:`TIME_LIMIT_SECONDS` (a BaseException, so no reader can swallow it)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise InputTimeout(f"one input ran over {TIME_LIMIT_SECONDS:g} s")


def _address_space() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def set_limits() -> None:
    """The per-input bounds: an alarm handler for the time limit, RLIMIT_AS for memory."""
    signal.signal(signal.SIGALRM, _on_alarm)
    limit = _address_space() + MEMORY_ALLOWANCE
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


# ---- seeds ---------------------------------------------------------------------------------------


def seeds() -> list[bytes]:
    """Valid files of each format, each prefixed with its format's byte."""
    from hostile_files import make_safetensors, onnx_graph, onnx_model, onnx_tensor, valid_gguf

    files: list[tuple[str, bytes]] = [("gguf", valid_gguf())]
    try:
        from tiny_gguf import write_tiny_llama

        with tempfile.TemporaryDirectory() as folder:
            path = write_tiny_llama(Path(folder) / "tiny.gguf", layers=1, embedding=8, heads=2, kv_heads=2)
            files.append(("gguf", path.read_bytes()))
            for index, template in enumerate(HOSTILE_TEMPLATES):
                small = {"layers": 1, "embedding": 8, "heads": 2, "kv_heads": 2, "chat_template": template}
                path = write_tiny_llama(Path(folder) / f"hostile-{index}.gguf", **small)
                files.append(("gguf", path.read_bytes()))
    except ImportError:  # gguf or numpy missing: the hand-built GGUF still seeds
        pass
    header = {
        "__metadata__": {"format": "pt"},
        "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "b": {"dtype": "BF16", "shape": [3], "data_offsets": [24, 30]},
    }
    files.append(("safetensors", make_safetensors(header, bytes(30))))
    files.append(("onnx", onnx_model(onnx_graph([onnx_tensor("w", location="w.bin", offset=0, length=16)]))))
    files.append(("onnx", onnx_model(onnx_graph([onnx_tensor("inline", raw_data=bytes(16))]))))
    return [bytes([FORMATS.index(fmt)]) + data for fmt, data in files]


# ---- one input -----------------------------------------------------------------------------------


class Target:
    """Runs inputs through the readers and describe in a scratch folder, counting outcomes."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        (folder / "w.bin").write_bytes(bytes(16))
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.count = 0
        self.started = time.monotonic()

    def __call__(self, data: bytes) -> None:
        signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_SECONDS)
        try:
            self._check(data)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        self.count += 1
        if self.count % _REPORT_EVERY == 0:
            self.report()

    def _check(self, data: bytes) -> None:
        from anyformer import describe
        from anyformer.files._gguf_header import BytesByteSource, read_gguf_header
        from anyformer.files._onnx_external import check_onnx_external_data, read_onnx_summary
        from anyformer.files._safetensors_header import read_safetensors_header

        fmt = FORMATS[data[0] % len(FORMATS)] if data else "gguf"
        body = data[1:]
        path = self.folder / ("model.onnx" if fmt == "onnx" else f"m.{fmt}")
        path.write_bytes(body)
        calls = {
            "gguf": [lambda: read_gguf_header(BytesByteSource(body), name="m.gguf")],
            "safetensors": [lambda: read_safetensors_header(BytesByteSource(body), name="m.safetensors")],
            "onnx": [lambda: read_onnx_summary(path), lambda: check_onnx_external_data(path)],
        }[fmt]
        for index, call in enumerate([*calls, lambda: describe(path)]):
            self.outcomes[f"{fmt}:{'describe' if index == len(calls) else 'reader'}:{_outcome(call)}"] += 1
        if fmt == "gguf":
            rendered = _template_outcome(body)
            if rendered is not None:
                self.outcomes[f"gguf:template:{rendered}"] += 1

    def report(self) -> None:
        """One line to stderr: inputs so far, rate, and how they ended."""
        elapsed = time.monotonic() - self.started
        summary = json.dumps(dict(sorted(self.outcomes.items())))
        print(
            f"fuzz: {self.count} inputs in {elapsed:.1f} s ({self.count / elapsed:.0f}/s), {summary}", file=sys.stderr
        )


def _outcome(call: Any) -> str:
    from anyformer import AnyformerError

    try:
        call()
    except AnyformerError as exc:
        cause = exc.__cause__
        if isinstance(cause, (MemoryError, RecursionError)):
            raise Finding(f"{exc.code.value} wraps {type(cause).__name__}: {exc.message}") from cause
        return exc.code.value
    except (InputTimeout, Finding):
        raise
    except BaseException as exc:
        raise Finding(f"{type(exc).__name__} escaped: {exc}") from exc
    return "ok"


def _template_outcome(body: bytes) -> str | None:
    """Render the GGUF's chat template, if it has one: any ``AnyformerError`` is an answer (a template
    that recurses too deep is refused by design), anything else escaping, or the input's time limit, a finding."""
    from anyformer import AnyformerError, render_chat
    from anyformer.files._gguf_header import BytesByteSource, read_gguf_header

    try:
        template = read_gguf_header(BytesByteSource(body), name="m.gguf").get("tokenizer.chat_template")
    except AnyformerError:
        return None
    if not isinstance(template, str):
        return None
    try:
        render_chat(template, [{"role": "user", "content": "hi"}], time_limit=TEMPLATE_SECONDS)
    except AnyformerError as exc:
        return exc.code.value
    except (InputTimeout, Finding):
        raise
    except BaseException as exc:
        raise Finding(f"rendering the chat template: {type(exc).__name__} escaped: {exc}") from exc
    return "ok"


# ---- mutations (the run without atheris, and the CI smoke test) ----------------------------------

_INTERESTING = [0, 1, 2**7, 2**8 - 1, 2**15, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63, 2**64 - 1]


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One to four random edits: bit flips, interesting integers, cuts, duplications, splices."""
    out = bytearray(data)
    for _ in range(rng.randrange(1, 5)):
        kind = rng.randrange(6)
        at = rng.randrange(len(out) + 1)
        if kind == 0 and out:
            at = min(at, len(out) - 1)
            out[at] ^= 1 << rng.randrange(8)
        elif kind == 1:
            value = rng.choice(_INTERESTING) + rng.choice([-1, 0, 0, 1])
            width, fmt = rng.choice([(4, "<I"), (8, "<Q")])
            out[at : at + width] = struct.pack(fmt, value % (1 << (8 * width)))
        elif kind == 2:
            del out[at : at + rng.randrange(1, 64)]
        elif kind == 3:
            out[at:at] = out[at : at + rng.randrange(1, 64)]
        elif kind == 4:
            out = out[: rng.randrange(len(out) + 1)]
        else:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
    return bytes(out)


def run_random(target: Target, pool: list[bytes], count: int, seed: int) -> None:
    """``count`` random mutations of the seeds (and of earlier mutants), deterministic per ``seed``."""
    rng = random.Random(seed)
    pool = list(pool)
    for _ in range(count):
        parent = rng.choice(pool)
        child = parent[:1] + mutate(parent[1:], rng)
        target(child)
        if len(pool) < 512 and rng.random() < 0.05:
            pool.append(child)


def instrument() -> None:
    """Import anyformer's readers with atheris's coverage instrumentation (before anything imports them)."""
    import atheris

    with atheris.instrument_imports(include=["anyformer"]):
        import anyformer._describe
        import anyformer.files._gguf_header
        import anyformer.files._onnx_external
        import anyformer.files._safetensors_header  # noqa: F401


def run_atheris(target: Target, pool: list[bytes], argv: list[str]) -> None:
    """Coverage-guided with atheris (libFuzzer); the seeds become the starting corpus."""
    import atheris

    corpus = Path(tempfile.mkdtemp(prefix="anyformer-fuzz-corpus-"))
    for index, seed in enumerate(pool):
        (corpus / f"seed-{index}").write_bytes(seed)
    rss = Path("/proc/self/statm").read_text().split()[1]
    rss_mb = int(rss) * resource.getpagesize() // 2**20
    flags = [f"-rss_limit_mb={rss_mb + MEMORY_ALLOWANCE // 2**20}", "-max_len=65536", *argv, str(corpus)]
    atheris.Setup([sys.argv[0], *flags], target)
    atheris.Fuzz()


def main() -> None:
    """Parse ``--random N`` (else every argument goes to libFuzzer), set the limits, fuzz."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", type=int, metavar="N", help="N random mutations instead of atheris")
    parser.add_argument("--seed", type=int, default=0)
    args, rest = parser.parse_known_args()
    if args.random is None:
        instrument()
    pool = seeds()
    with tempfile.TemporaryDirectory(prefix="anyformer-fuzz-") as folder:
        target = Target(Path(folder))
        target(pool[0])  # imports every reader before the limit, so the limit bounds inputs only
        set_limits()
        if args.random is not None:
            run_random(target, pool, args.random, args.seed)
            target.report()
            print(f"fuzz: done, {target.count} inputs, no finding", file=sys.stderr)
            return
        run_atheris(target, pool, rest)


if __name__ == "__main__":
    main()
