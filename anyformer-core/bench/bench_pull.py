"""Pull throughput: anyformer's verified, resumable download against a plain ``hf_hub_download``.

A FakeHub in a child process serves a repo of ``--files`` weight files of ``--size-mb`` each from a
temporary folder (sendfile). Each round downloads every file once with ``anyformer.fetch_files``
(HEAD, GET, sha256 while writing, rename, link) and once with ``hf_hub_download`` (HEAD, GET,
size check), each into a fresh cache, in alternating order. Reports the median MB/s of each and
their ratio. Target: anyformer ≥ 0.95 × huggingface_hub.

    python anyformer-core/bench/bench_pull.py [--files 2] [--size-mb 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: The core's test support (the fake Hub lives there, with the tests that use it).
_TEST_SUPPORT = Path(__file__).resolve().parents[1] / "tests"
_SERVER = """
import pathlib, sys
sys.path.insert(0, {src!r})
from hub_server import FakeHub
folder = pathlib.Path({folder!r})
hub = FakeHub()
hub.add_repo("bench/model", {{p.name: p for p in sorted(folder.iterdir())}})
print(hub.start(), flush=True)
sys.stdin.read()
"""


def _write_files(folder: Path, count: int, size: int) -> list[str]:
    block = os.urandom(1 << 20)
    names = []
    for index in range(count):
        name = f"model-{index:05d}-of-{count:05d}.safetensors"
        with (folder / name).open("wb") as f:
            left = size
            while left > 0:
                piece = (index.to_bytes(8, "little") + block)[: min(left, 1 << 20)]
                f.write(piece)
                left -= len(piece)
        names.append(name)
    (folder / "config.json").write_bytes(b'{"model_type": "llama"}')
    return names


def _timed(function, *arguments) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    function(*arguments)
    return time.perf_counter() - start


def main() -> None:
    """Print each round's MB/s, the medians and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2)
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    size = args.size_mb * 10**6

    import pytest

    sys.path.insert(0, str(_TEST_SUPPORT))
    from hub_fixtures import point_huggingface_hub_at

    with tempfile.TemporaryDirectory(prefix="bench-pull-") as tmp:
        root = Path(tmp)
        served = root / "served"
        served.mkdir()
        names = _write_files(served, args.files, size)
        server = subprocess.Popen(
            [sys.executable, "-c", _SERVER.format(src=str(_TEST_SUPPORT), folder=str(served))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None
            url = server.stdout.readline().strip()
            with pytest.MonkeyPatch.context() as monkeypatch:
                point_huggingface_hub_at(monkeypatch, url, root / "hf")
                _rounds(root, names, args.rounds, args.files * size)
        finally:
            server.terminate()
            server.wait()


def _rounds(root: Path, names: list[str], rounds: int, total_bytes: int) -> None:
    import huggingface_hub
    from huggingface_hub import constants

    import anyformer

    model = anyformer.describe("bench/model")  # metadata only, outside the timing

    def with_anyformer() -> None:
        anyformer.fetch_files(model, names)

    def with_huggingface_hub() -> None:
        for name in names:
            huggingface_hub.hf_hub_download("bench/model", name, revision=model.revision)

    speeds: dict[str, list[float]] = {"anyformer": [], "huggingface_hub": []}
    runners = {"anyformer": with_anyformer, "huggingface_hub": with_huggingface_hub}
    cache = Path(constants.HF_HUB_CACHE)
    for index in range(rounds):
        order = ["anyformer", "huggingface_hub"] if index % 2 == 0 else ["huggingface_hub", "anyformer"]
        for who in order:
            shutil.rmtree(cache, ignore_errors=True)
            seconds = _timed(runners[who])
            speeds[who].append(total_bytes / seconds / 1e6)
            megabytes = total_bytes / 1e6
            print(f"round {index + 1} {who:>16}: {megabytes:.0f} MB in {seconds:.2f} s = {speeds[who][-1]:.0f} MB/s")
    ours = statistics.median(speeds["anyformer"])
    theirs = statistics.median(speeds["huggingface_hub"])
    print(f"median anyformer {ours:.0f} MB/s, huggingface_hub {theirs:.0f} MB/s", end=": ")
    print(f"ratio {ours / theirs:.3f} (target >= 0.95)")


if __name__ == "__main__":
    main()
