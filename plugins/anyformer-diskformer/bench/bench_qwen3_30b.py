"""diskformer at Qwen3-30B-A3B's real layer shapes, larger than its memory, against llama.cpp under the same limit.

The model is random: hidden 2048, 32 query heads and 4 KV heads of 128, 128 experts of 768, top-8,
Q4_K (random blocks), as Qwen3-30B-A3B, but with fewer layers (default 8 of its 48, ~2.8 GB, so the
file stays small enough for a shared machine's /tmp) and the tests' tiny vocabulary. For each budget
(the bytes the engine may hold: dense + KV + expert cache), one run of each engine in its own process
under a memory cgroup of that budget plus a fixed allowance for the Python runtime (cgroup v1 or v2,
whichever is writable; without one, unlimited and labelled so):

- diskformer: decode tok/s after a short prompt, the hit rate (cache or prefetch) against Belady's
  optimal cache and LRU on the same routing trace at the same expert slots, bytes read per token,
  and tok/s as a fraction of the bound the disk allows (its bandwidth, measured first by reading the
  whole file sequentially with O_DIRECT, over the bytes read per token);
- llama.cpp (llama-cpp-python, mmap, the page cache under the same cgroup): decode tok/s.

Before each engine runs, the file's pages are written back and dropped from the page cache, so
neither finds the model in memory that its cgroup was not charged for.

Usage (as root for the cgroup; under nice, the file deleted after):

    nice -n 10 python plugins/anyformer-diskformer/bench/bench_qwen3_30b.py [--layers 8] [--tokens 4]
        [--device gpu|cpu] [--budgets 0.5,0.25,0.1] [--threads 2] [--prefetch N] [--engines diskformer,llama]
        [--page-cache] [--cpu-experts]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

# llama-cpp-python before numpy: a CUDA build of it made on the H200 machine segfaults while loading a model
# if the image's numpy was imported first (seen 2026-11-30 and 2026-12-01; cause not established).
try:
    import llama_cpp  # noqa: F401
except ImportError:
    pass
import numpy as np

PROMPT = [1, 60, 75, 82]
#: Memory the cgroup allows each process besides the budget: the interpreter, numpy, wgpu, llama.cpp's context.
RUNTIME_ALLOWANCE = 384 * 2**20
CHUNK = 8 * 2**20


def qwen3_30b_shapes(layers: int) -> object:
    """Qwen3-30B-A3B's layer shapes with ``layers`` layers, Q4_K."""
    from anyformer_diskformer.testing import TinyMoE

    return TinyMoE(
        n_layer=layers,
        n_embd=2048,
        n_head=32,
        n_kv=4,
        head_dim=128,
        n_expert=128,
        n_expert_used=8,
        n_ff_exp=768,
        n_ctx=4096,
        quant="Q4_K",
        scale=0.02,
    )


def disk_bandwidth(path: str) -> tuple[float, str]:
    """Bytes a second reading ``path`` whole, sequentially, with O_DIRECT (else after dropping its pages)."""
    size = os.path.getsize(path)
    buffer = mmap.mmap(-1, CHUNK)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        how = "O_DIRECT"
    except (AttributeError, OSError):
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, size, os.POSIX_FADV_DONTNEED)
        how = "pread after POSIX_FADV_DONTNEED (no O_DIRECT)"
    began = time.perf_counter()
    done = 0
    while done < size:
        got = os.preadv(fd, [buffer], done)
        if got <= 0:
            break
        done += got
    took = time.perf_counter() - began
    os.close(fd)
    return done / took, how


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[tuple[str | None, str]]:
    """A memory cgroup of ``limit`` bytes (v2, else v1) and its procs file; (None, why) where none is writable."""
    name = f"anyformer-bench-{os.getpid()}"
    candidates = (
        ("/sys/fs/cgroup", "memory.max", "v2"),
        ("/sys/fs/cgroup/unified", "memory.max", "v2"),
        ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "v1"),
    )
    for root, limit_file, version in candidates:
        # Only a mounted cgroup hierarchy of that version counts (a tmpfs would take any file name).
        marker = "cgroup.controllers" if version == "v2" else "memory.limit_in_bytes"
        if not os.path.exists(os.path.join(root, marker)):
            continue
        folder = os.path.join(root, name)
        try:
            os.mkdir(folder)
        except OSError:
            continue
        limit_path = os.path.join(folder, limit_file)
        try:
            if not os.path.exists(limit_path):
                raise OSError("no memory controller here")
            with open(limit_path, "w") as f:
                f.write(str(limit))
        except OSError:
            os.rmdir(folder)
            continue
        try:
            yield os.path.join(folder, "cgroup.procs"), f"cgroup {version} {folder}"
        finally:
            for _ in range(50):  # the children have exited; the kernel may take a moment to let go
                try:
                    os.rmdir(folder)
                    break
                except OSError:
                    time.sleep(0.1)
        return
    yield None, "no writable memory cgroup: NOT memory-limited"


def drop_file_cache(path: str) -> None:
    """Write back and drop the kernel's cached pages of ``path``, so the next engine reads it from the disk.

    Without this llama.cpp's mmap would find the file in the page cache (just written, or read by the run
    before), charged to no limited cgroup, and its speed would not be that of a model larger than memory.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cached_fraction(path: str) -> float:
    """The fraction of ``path``'s pages in the page cache now (mincore over a read-only mapping)."""
    import ctypes

    size = os.path.getsize(path)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vector = (ctypes.c_ubyte * pages)()
        try:
            if libc.mincore(ctypes.c_void_p(address), size, vector) != 0:
                return float("nan")
        finally:
            libc.munmap(ctypes.c_void_p(address), size)
    finally:
        os.close(fd)
    return sum(v & 1 for v in vector) / pages


def run_child(args: list[str], procs: str | None, drop: bool = True) -> dict[str, object]:
    """Run this script as a child (joining the cgroup first) and return the JSON its last line prints.

    With ``drop`` the file's pages leave the page cache first; without, the file is read once so it is all there.
    """

    def join() -> None:
        if procs is not None:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

    if drop:
        drop_file_cache(args[2])  # every child starts with none of the model in the page cache
    else:
        with open(args[2], "rb") as f:  # every child starts with all of it there
            while f.read(CHUNK):
                pass
    out = subprocess.run(
        [sys.executable, __file__, *args], preexec_fn=join, capture_output=True, text=True, check=False
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": f"exit {out.returncode}: {(out.stderr or out.stdout).strip().splitlines()[-3:]}"}
    return json.loads(lines[-1])


def greedy_speed(llm: object, tokens: int) -> dict[str, object]:
    """Decode tok/s of ``tokens`` greedy steps after the prompt, through ``Llama.eval``; closes ``llm``."""
    llm.eval(PROMPT)  # type: ignore[attr-defined]
    token = int(np.argmax(llm.scores[llm.n_tokens - 1]))  # type: ignore[attr-defined]
    began = time.perf_counter()
    for _ in range(tokens):
        llm.eval([token])  # type: ignore[attr-defined]
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))  # type: ignore[attr-defined]
    took = time.perf_counter() - began
    llm.close()  # type: ignore[attr-defined]
    return {"tok_per_sec": tokens / took}


def child_llama(path: str, tokens: int, threads: int, repack: bool) -> dict[str, object]:
    """llama.cpp's decode tok/s on ``path`` (mmap), greedy after the prompt.

    Without ``repack`` the model loads with ``use_extra_bufts`` off: llama.cpp's CPU build otherwise
    copies Q4_K weights into repacked buffers of its own (anonymous memory, the whole model), and
    the mmap is then no longer what bounds its memory.
    """
    import llama_cpp.llama_cpp as native
    from llama_cpp import Llama

    if not repack:
        default = native.llama_model_default_params

        def no_repack() -> object:
            params = default()
            params.use_extra_bufts = False
            return params

        native.llama_model_default_params = no_repack
    llm = Llama(path, n_ctx=256, n_threads=threads, type_k=0, type_v=0, use_mmap=True, verbose=False)
    return greedy_speed(llm, tokens)


#: The buffer-type overrides handed to llama.cpp: kept alive for as long as the model is loaded.
_OVERRIDES: list[object] = []


def experts_on_cpu(params: object) -> None:
    """Set ``params.tensor_buft_overrides`` so every routed expert tensor stays in host memory.

    This is what llama.cpp's ``--n-cpu-moe`` / ``-ot "exps=CPU"`` do: the dense layers on the GPU, the
    experts' products run by the CPU from the mmapped file. llama-cpp-python has no argument for it,
    so the NULL-terminated array is built here from the CPU backend's buffer type.
    """
    import ctypes

    import llama_cpp.llama_cpp as native

    class Override(ctypes.Structure):
        _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]

    cpu = ctypes.CDLL(os.path.join(str(native._base_path), "libggml-cpu.so"))
    cpu.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
    table = (Override * 2)(
        Override(rb"ffn_(up|down|gate)_exps", cpu.ggml_backend_cpu_buffer_type()), Override(None, None)
    )
    _OVERRIDES.append(table)
    params.tensor_buft_overrides = ctypes.cast(table, ctypes.c_void_p)  # type: ignore[attr-defined]


def child_llama_cuda(path: str, tokens: int, threads: int) -> dict[str, object]:
    """llama.cpp CUDA's decode tok/s on ``path``: every layer offloaded, the routed experts kept on the CPU."""
    import llama_cpp.llama_cpp as native
    from llama_cpp import Llama

    default = native.llama_model_default_params

    def cpu_experts() -> object:
        params = default()
        experts_on_cpu(params)
        return params

    native.llama_model_default_params = cpu_experts
    llm = Llama(path, n_ctx=256, n_gpu_layers=-1, n_threads=threads, use_mmap=True, flash_attn=True, verbose=False)
    return greedy_speed(llm, tokens)


def child_diskformer(
    path: str,
    tokens: int,
    budget: int,
    device: str,
    trace: str,
    policy: str,
    threads: int,
    prefetch: int,
    direct_io: bool = True,
    prefetch_threads: int = 0,
    cpu_experts: bool = False,
) -> dict[str, object]:
    """The engine's decode tok/s with the expert cache the budget leaves, its counters and the slots it had."""
    import anyformer
    from anyformer import Request
    from anyformer.plugin import read_gguf_header
    from anyformer_diskformer.model import DiskformerModel
    from anyformer_diskformer.plan import plan_from_header
    from anyformer_diskformer.trace import TRACE_ENV

    plan = plan_from_header(read_gguf_header(path), 256, device)
    pool = budget - plan.fixed_bytes
    os.environ[TRACE_ENV] = trace
    options: dict[str, object] = {
        "pool_bytes": pool,
        "device": device,
        "cache_policy": policy,
        "threads": threads,
        "direct_io": direct_io,
    }
    if cpu_experts:
        options["cpu_experts"] = True
    if prefetch >= 0:
        options["prefetch"] = prefetch
    if prefetch_threads > 0:
        options["prefetch_threads"] = prefetch_threads
    model = DiskformerModel.open(anyformer.describe(path), Request(context=256, options=options), lambda e: None)
    try:
        engine = model.engine
        assert engine is not None
        stats = engine.cache.stats
        logits = engine.forward(PROMPT, 0, every=False)[-1]
        before = (stats.hits, stats.prefetched, stats.lookups, stats.bytes_read, stats.cpu_computed)
        began = time.perf_counter()
        for step in range(tokens):
            logits = engine.forward([int(np.argmax(logits))], len(PROMPT) + step, every=False)[-1]
        took = time.perf_counter() - began
        lookups = stats.lookups - before[2]
        return {
            "tok_per_sec": tokens / took,
            "hit_rate": (stats.hits + stats.prefetched - before[0] - before[1]) / max(1, lookups),
            "bytes_per_token": (stats.bytes_read - before[3]) / tokens,
            "cpu_per_token": (stats.cpu_computed - before[4]) / tokens,
            "pool": pool,
            "slots": engine.cache.capacity_bytes // engine.cache.expert_bytes,
            "pool_slots": pool // engine.cache.expert_bytes,
            "prompt_lookups": before[2],
            "read_method": model.read_method,
            "prefetch": model.prefetch_width,
        }
    finally:
        model.dispose()


def main() -> None:
    """Write the model, time the disk, run both engines at each budget, print the table, delete the file."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--budgets", default="0.5,0.25,0.1", help="budgets as fractions of the file's size")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--folder", default=tempfile.gettempdir())
    parser.add_argument(
        "--model", help="the GGUF to use: written there first when missing, and kept (default: a temporary file)"
    )
    parser.add_argument("--policy", default="reuse", choices=("reuse", "lru", "lrfu"), help="diskformer's cache policy")
    parser.add_argument("--prefetch", type=int, default=-1, help="diskformer's prefetch width (default: its top-k)")
    parser.add_argument(
        "--prefetch-threads", type=int, default=0, help="diskformer's reader threads (default: the engine's own)"
    )
    parser.add_argument("--engines", default="diskformer,llama", help="which engines to run (comma-separated)")
    parser.add_argument(
        "--llama-cuda",
        action="store_true",
        help="llama.cpp as a CUDA build with every layer on the GPU and the experts on the CPU (n_cpu_moe), instead "
        "of its CPU build",
    )
    parser.add_argument(
        "--page-cache",
        action="store_true",
        help="keep the file in the page cache (host memory) for every engine, no memory cgroup, and diskformer reads "
        "through it (direct_io off): experts from host memory rather than from the disk",
    )
    parser.add_argument(
        "--cpu-experts",
        action="store_true",
        help="diskformer's GPU engine computes the experts its cache misses on the CPU while decoding (the cpu_experts "
        "load option, on --threads threads) instead of uploading them",
    )
    parser.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, path, *rest = args.child
        if kind == "llama":
            print(json.dumps(child_llama(path, int(rest[0]), int(rest[1]), rest[2] == "repack")))
        elif kind == "llamacuda":
            print(json.dumps(child_llama_cuda(path, int(rest[0]), int(rest[1]))))
        else:
            numbers = int(rest[0]), int(rest[1])
            direct = rest[7] == "direct" if len(rest) > 7 else True
            readers = int(rest[8]) if len(rest) > 8 else 0
            on_cpu = len(rest) > 9 and rest[9] == "cpu-experts"
            result = child_diskformer(
                path, *numbers, rest[2], rest[3], rest[4], int(rest[5]), int(rest[6]), direct, readers, on_cpu
            )
            print(json.dumps(result))
        return

    from anyformer.plugin import read_gguf_header
    from anyformer_diskformer.cache.policies import make_policy, replay
    from anyformer_diskformer.plan import plan_from_header
    from anyformer_diskformer.testing import write_tiny_moe
    from anyformer_diskformer.trace import read_trace, replay_belady, replay_lru

    folder = tempfile.mkdtemp(prefix="anyformer-diskformer-bench-", dir=args.folder)
    try:
        path = args.model or os.path.join(folder, "qwen3-30b-a3b-shapes.gguf")
        if not os.path.exists(path):
            write_tiny_moe(path, qwen3_30b_shapes(args.layers))  # type: ignore[arg-type]
        args.layers = int(read_gguf_header(path).kv.get("qwen3moe.block_count", args.layers))
        size = os.path.getsize(path)
        plan = plan_from_header(read_gguf_header(path), 256, args.device)
        print(
            f"model: Qwen3-30B-A3B layer shapes, {args.layers} of 48 layers, Q4_K random, {size / 1e9:.2f} GB "
            f"(experts {plan.expert_bytes_total / 1e9:.2f} GB, {plan.one_expert_bytes / 1e6:.2f} MB each; "
            f"dense + KV {plan.fixed_bytes / 1e6:.0f} MB); device {args.device}; {args.tokens} decode tokens"
        )
        drop_file_cache(path)
        disk, how = disk_bandwidth(path)
        print(f"disk: {disk / 1e6:.0f} MB/s sequential ({how}, the whole file)")
        if args.device == "gpu":
            os.environ.setdefault("ANYFORMER_SOFTWARE_GPU", "1")
        for fraction in (float(f) for f in args.budgets.split(",")):
            budget = int(size * fraction)
            trace = os.path.join(folder, f"trace-{fraction}.jsonl")
            engines = args.engines.split(",")
            mine: dict[str, object] = {"error": "not run"}
            theirs: dict[str, dict[str, object]] = {}
            limit = contextlib.nullcontext((None, "no memory cgroup (--page-cache)"))
            with limit if args.page_cache else memory_cgroup(budget + RUNTIME_ALLOWANCE) as (procs, limit_how):
                if "diskformer" in engines:
                    mine = run_child(
                        [
                            *("--child", "diskformer", path, str(args.tokens), str(budget), args.device, trace),
                            *(args.policy, str(args.threads), str(args.prefetch)),
                            "page-cache" if args.page_cache else "direct",
                            str(args.prefetch_threads),
                            "cpu-experts" if args.cpu_experts else "upload",
                        ],
                        procs,
                        drop=not args.page_cache,
                    )
                if "llama" in engines and args.llama_cuda:
                    child = ["--child", "llamacuda", path, str(args.tokens), str(args.threads)]
                    theirs["cuda"] = run_child(child, procs, drop=not args.page_cache)
                elif "llama" in engines:
                    for variant in ("repack", "no-repack"):
                        child = ["--child", "llama", path, str(args.tokens), str(args.threads), variant]
                        theirs[variant] = run_child(child, procs)
            load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
            print(
                f"\nbudget {budget / 1e9:.2f} GB ({fraction:.0%} of the file; limit = budget + "
                f"{RUNTIME_ALLOWANCE >> 20} MiB runtime, {limit_how}); machine load {load} on {os.cpu_count()} cores; "
                f"the file's page cache {'filled' if args.page_cache else 'dropped'} before each engine "
                f"({cached_fraction(path):.0%} cached now)"
            )
            if "error" in mine:
                print(f"  diskformer: {mine['error']}")
            else:
                accesses = read_trace(trace)
                decode = accesses[int(mine["prompt_lookups"]) :]  # type: ignore[call-overload]
                slots = int(mine["pool_slots"])  # type: ignore[call-overload]
                belady = replay_belady(accesses, slots) - replay_belady(accesses[: len(accesses) - len(decode)], slots)
                lru = replay_lru(accesses, slots) - replay_lru(accesses[: len(accesses) - len(decode)], slots)
                prompt = accesses[: len(accesses) - len(decode)]
                # Each policy alone (no prefetch) on the same trace and slots.
                alone = {
                    name: replay(accesses, slots, make_policy(name, args.layers))
                    - replay(prompt, slots, make_policy(name, args.layers))
                    for name in ("lrfu", "reuse")
                }
                per_token = float(mine["bytes_per_token"])  # type: ignore[arg-type]
                cpu_per_token = float(mine["cpu_per_token"])  # type: ignore[arg-type]
                on_cpu = f"misses on the CPU ({cpu_per_token:.1f} experts a token), " if args.cpu_experts else ""
                bound = disk / per_token if per_token else float("inf")
                speed = float(mine["tok_per_sec"])  # type: ignore[arg-type]
                print(
                    f"  diskformer ({args.policy}, {mine['read_method']}, prefetch {mine['prefetch']}, "
                    f"{on_cpu}"
                    f"{mine['slots']} cache slots "
                    f"of {slots} in the pool): {speed:.3f} tok/s, hit rate {float(mine['hit_rate']):.0%} "  # type: ignore[arg-type]
                    f"(Belady {belady / max(1, len(decode)):.0%}, LRU {lru / max(1, len(decode)):.0%}, "
                    f"LRFU {alone['lrfu'] / max(1, len(decode)):.0%}, reuse {alone['reuse'] / max(1, len(decode)):.0%} "
                    f"replayed without prefetch at {slots} slots), {per_token / 1e6:.0f} MB read a token, "
                    f"disk bound {bound:.2f} tok/s, "
                    f"fraction {speed / bound if bound != float('inf') else 0:.2f}"
                )
            for variant, result in theirs.items():
                label = {
                    "repack": "default, Q4_K repacked into its own buffers",
                    "no-repack": "use_extra_bufts off",
                    "cuda": "CUDA, every layer on the GPU, experts on the CPU (n_cpu_moe), flash attention",
                }[variant]
                if "error" in result:
                    killed = " (killed: over the memory limit)" if "exit -9" in str(result["error"]) else ""
                    print(f"  llama.cpp (mmap, {label}): {result['error']}{killed}")
                    continue
                theirs_speed = float(result["tok_per_sec"])  # type: ignore[arg-type]
                ratio = float(mine["tok_per_sec"]) / theirs_speed if "error" not in mine else 0.0  # type: ignore[arg-type]
                print(
                    f"  llama.cpp (mmap, {label}, {args.threads} threads): {theirs_speed:.3f} tok/s; "
                    f"diskformer/llama.cpp {ratio:.2f}"
                )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
