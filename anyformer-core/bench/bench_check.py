"""How long ``anyformer check`` on a local description takes beyond the interpreter's own start-up.

Runs ``python -c pass`` and ``python -m anyformer check --describe m.json … --json`` alternately,
each in a fresh process, and reports the medians and their difference. Target: ≤ 150 ms over the
bare interpreter with every installed plugin loaded.

    python anyformer-core/bench/bench_check.py [--runs 21]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DESCRIPTION = {
    "repo": "bench/SmolLM2-135M-Instruct-GGUF",
    "architecture": "llama",
    "task": "text-generation",
    "tags": ["gguf"],
    "files": [{"name": "SmolLM2-135M-Instruct.Q4_1.gguf", "size": 98362432}, {"name": "config.json", "size": 700}],
}


def _time(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    """Print the medians of both commands and the overhead, in milliseconds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        description = Path(folder) / "m.json"
        description.write_text(json.dumps(DESCRIPTION))
        bare = [sys.executable, "-c", "pass"]
        check = [
            sys.executable,
            "-m",
            "anyformer",
            "check",
            "--describe",
            str(description),
            "--caps",
            "gpu,f16",
            "--budget",
            "4GB",
            "--ram",
            "16GB",
            "--json",
        ]
        done = subprocess.run(check, capture_output=True, text=True, check=False)
        verdicts = json.loads(done.stdout)["verdicts"]
        _time(bare), _time(check)  # warm the file cache
        bare_times, check_times = [], []
        for _ in range(args.runs):
            bare_times.append(_time(bare))
            check_times.append(_time(check))
    bare_ms = statistics.median(bare_times) * 1000
    check_ms = statistics.median(check_times) * 1000
    print(f"backends answering: {', '.join(v['backend'] for v in verdicts) or 'none'}")
    print(f"python -c pass:          median {bare_ms:7.1f} ms over {args.runs} runs")
    print(f"anyformer check --json:  median {check_ms:7.1f} ms")
    print(f"overhead beyond start-up: {check_ms - bare_ms:.1f} ms (target ≤ 150 ms)")


if __name__ == "__main__":
    main()
