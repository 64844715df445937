"""What this GPU adapter's kernels cost, timed once and kept: the figures the decode-speed model multiplies.

``can_run`` may not open a model file, and opening the GPU in the process that asks would hold a
device and cost it wgpu's start-up; so the timing runs in a child process
(``python -m anyformer_gguf_gpu.adapter_speed``), on synthetic weights, with the engines' own
kernels (the matrix-vector product per weight format, as :class:`~anyformer_gguf_gpu.kernels.Kernels`
picks its layout for the adapter). It measures:

- ``floor_s``: the GPU time of one tiny dispatch among many in one submission (every dispatch of a
  step pays at least this: a barrier and the launch);
- ``encode_s``: the host's time to encode one dispatch (a step's dispatches are encoded every token);
- ``roundtrip_s``: one submission of one tiny dispatch and the read-back of its result (an engine that
  reads back inside a token, as diskformer's router does a layer, pays it each time);
- ``upload_bytes_per_s``: host-to-GPU bytes a second of a buffer write (experts uploaded as they are read);
- ``bytes_per_s``: weight bytes a second of a large product, per format: only the formats a model asked
  about are timed (each a kernel to compile: seconds on a software adapter), and added to the kept
  figures as later models ask about others.

The figures are kept in ``ANYFORMER_HOME/gguf-gpu/adapter-speed.json`` under a key of the adapter's
fingerprint (the core's: boot, driver, wgpu, environment), whether a software adapter was allowed,
and a digest of the kernels' sources, so a new driver or a changed kernel times again and nothing
else does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: Formats the engines multiply (those a decode step reads its weights in).
TIMED_FORMATS = ("F16", "BF16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
#: The large product timed per format, rows × columns: ~19-67 MB on a hardware adapter; on a software one 1-8 MB,
#: past a CPU's caches (a CPU runs it at some hundred MB a second, and the first check waits for it).
HARDWARE_SHAPE = (8192, 4096)
SOFTWARE_SHAPE = (2048, 2048)
#: How long the child may take (a software adapter compiles each kernel on the CPU).
TIMEOUT_S = 180.0
#: A kept file larger than this is not ours.
_MAX_KEPT_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class AdapterSpeed:
    """One adapter's timed kernel costs (see the module's docstring)."""

    adapter: str
    software: bool
    floor_s: float
    encode_s: float
    bytes_per_s: dict[str, float]
    roundtrip_s: float = 0.0
    upload_bytes_per_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AdapterSpeed:
        """The figures back from :meth:`to_dict` (``ValueError`` / ``KeyError`` / ``TypeError`` when not ours)."""
        rates = {str(k): float(v) for k, v in dict(data["bytes_per_s"]).items()}
        return cls(
            str(data["adapter"]),
            bool(data["software"]),
            float(data["floor_s"]),
            float(data["encode_s"]),
            rates,
            float(data.get("roundtrip_s", 0.0)),
            float(data.get("upload_bytes_per_s", 0.0)),
        )


def _best_seconds(run: Any, reps: int, tries: int = 3) -> float:
    """Seconds of ``run(reps)`` (which submits and waits), best of ``tries``, after a warm-up."""
    run(2)
    best = float("inf")
    for _ in range(tries):
        began = time.perf_counter()
        run(reps)
        best = min(best, time.perf_counter() - began)
    return best


def measure(gpu: Any, formats: tuple[str, ...] = TIMED_FORMATS) -> AdapterSpeed:
    """Time the adapter behind ``gpu`` (an open :class:`~anyformer_gguf_gpu.gpu.GPU`) now, with a product per format."""
    import numpy as np

    from anyformer_gguf_gpu.gpu import is_software
    from anyformer_gguf_gpu.kernels import Kernels
    from anyformer_gguf_gpu.quants import FORMATS
    from anyformer_gguf_gpu.testing import random_blocks

    software = is_software(gpu.info)
    kernels = Kernels(gpu)
    rng = np.random.default_rng(0)
    by_name = {f.name: f for f in FORMATS.values()}

    def product(fmt_name: str, rows: int, cols: int) -> tuple[Any, Any]:
        fmt = by_name[fmt_name]
        weights = gpu.upload(random_blocks(fmt, rows * cols, rng))
        x = gpu.upload(rng.standard_normal(cols).astype(np.float32))
        y = gpu.buffer(rows * 4)
        return kernels.matvec(weights, fmt, rows, cols, x, y), y

    def runner(dispatch: Any, y: Any) -> Any:
        def run(n: int) -> None:
            kernels.run([dispatch] * n)
            gpu.read(y, np.float32, 1)  # waits for the submission

        return run

    reps = 8 if software else 400
    tiny, tiny_out = product("Q8_0", 64, 256)
    floor = _best_seconds(runner(tiny, tiny_out), reps) / reps
    kernels.encode_seconds = 0.0
    encodes = 4 * reps
    kernels.run([tiny] * encodes)
    gpu.read(tiny_out, np.float32, 1)
    encode = kernels.encode_seconds / encodes
    roundtrip = _best_seconds(runner(tiny, tiny_out), 1)
    upload_bytes = (4 if software else 64) * 2**20
    staged = gpu.buffer(upload_bytes)
    payload = np.ones(upload_bytes // 4, dtype=np.float32)

    def upload(n: int) -> None:
        for _ in range(n):
            gpu.write(staged, payload)
        gpu.read(staged, np.float32, 1)  # waits for the writes

    upload_rate = upload_bytes * 2 / _best_seconds(upload, 2)
    rows, cols = SOFTWARE_SHAPE if software else HARDWARE_SHAPE
    rates: dict[str, float] = {}
    for name in formats:
        if name not in by_name or name == "F32":
            continue
        if name == "BF16" and not getattr(gpu, "has_f16", False):
            continue
        try:
            dispatch, out = product(name, rows, cols)
        except Exception:  # a format this adapter's kernels cannot compile: the model falls back to a neighbour
            continue
        big_reps = 2 if software else 40
        seconds = _best_seconds(runner(dispatch, out), big_reps, 2 if software else 3) / big_reps
        rates[name] = by_name[name].row_bytes(cols) * rows / max(seconds - floor, seconds / 2)
    return AdapterSpeed(gpu.name, software, floor, encode, rates, roundtrip, upload_rate)


def _kernel_digest() -> str:
    """A digest of the kernels' sources: a changed kernel is timed again."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted([here / "kernels.py", *(here / "wgsl").glob("*.wgsl")]):
        try:
            digest.update(path.name.encode() + path.read_bytes())
        except OSError:
            continue
    return digest.hexdigest()[:16]


def _key(allow_software: bool) -> str:
    from anyformer.plugin import adapter_fingerprint

    return f"{adapter_fingerprint()}:{int(allow_software)}:{_kernel_digest()}"


def _kept_file() -> Path:
    from anyformer.plugin import anyformer_home

    return anyformer_home() / "gguf-gpu" / "adapter-speed.json"


def _read_kept(key: str) -> AdapterSpeed | None:
    path = _kept_file()
    try:
        if path.stat().st_size > _MAX_KEPT_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        return AdapterSpeed.from_dict(data["speed"]) if data.get("key") == key else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # not kept yet, or not ours: time it again


def _keep(key: str, speed: AdapterSpeed) -> None:
    path = _kept_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps({"key": key, "speed": speed.to_dict()}), encoding="utf-8")
        os.replace(partial, path)
    except OSError:
        pass  # kept for this process only


def _time_in_child(allow_software: bool, formats: tuple[str, ...]) -> AdapterSpeed:
    env = dict(os.environ)
    env["ANYFORMER_SOFTWARE_GPU"] = "1" if allow_software else "0"
    done = subprocess.run(
        [sys.executable, "-m", "anyformer_gguf_gpu.adapter_speed", *formats],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the timing process failed: {last[:200]}")
    return AdapterSpeed.from_dict(json.loads(done.stdout.strip().splitlines()[-1]))


#: Figures found in this process, by key (a check of several files asks once).
_FOUND: dict[str, AdapterSpeed] = {}
#: Why timing failed in this process, by key: a machine without an adapter is not asked again per file.
_FAILED: dict[str, str] = {}


def adapter_speed(allow_software: bool, formats: tuple[str, ...] = ("F16",)) -> AdapterSpeed:
    """This machine's adapter figures with a rate for each of ``formats`` (F32 and unknown names are left
    out): kept ones when the key matches and they cover ``formats``, else the missing formats timed in a
    child process and kept with the others.

    Raises ``RuntimeError`` / ``subprocess.TimeoutExpired`` / ``OSError`` when the adapter cannot be timed
    (the caller leaves the speed unknown and says why).
    """
    key = _key(allow_software)
    known = _FOUND.get(key) or _read_kept(key)
    wanted = tuple(sorted({f for f in formats if f in TIMED_FORMATS}))
    missing = tuple(f for f in wanted if known is None or f not in known.bytes_per_s)
    if known is not None and not missing:
        _FOUND[key] = known
        return known
    if key in _FAILED:
        raise RuntimeError(_FAILED[key])
    try:
        timed = _time_in_child(allow_software, missing or ("F16",))
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
        _FAILED[key] = f"{type(exc).__name__}: {exc}"[:300]
        raise
    if known is not None:
        timed = dataclasses.replace(known, bytes_per_s={**known.bytes_per_s, **timed.bytes_per_s})
    _keep(key, timed)
    _FOUND[key] = timed
    return timed


def main() -> None:
    """Time the adapter in this process and print the figures as one JSON line (the child's job)."""
    from anyformer_gguf_gpu.gpu import GPU

    formats = tuple(sys.argv[1:]) or TIMED_FORMATS
    gpu = GPU()
    try:
        print(json.dumps(measure(gpu, formats).to_dict()))
    finally:
        gpu.close()


if __name__ == "__main__":
    main()
