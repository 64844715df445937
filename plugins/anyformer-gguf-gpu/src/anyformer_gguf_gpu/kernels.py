"""The WGSL kernels as ready-to-encode dispatches: pipelines compiled once, bind groups built at load.

A :class:`Dispatch` is everything one ``dispatch_workgroups`` needs, made when the engine is built,
so encoding a token is three calls per dispatch (set pipeline, set bind group, dispatch) and no
allocation. Shapes travel in a uniform block per dispatch (its own small buffer, or a slice of one
buffer an engine's step shares: :mod:`anyformer_gguf_gpu.programs`); the one value that changes per
token (the position) lives in a 16-byte state buffer the host writes before each submission.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib import resources
from typing import Any

import numpy as np

from anyformer_gguf_gpu.config import ATTENTION_CHUNK, attention_chunks, attention_scratch_bytes
from anyformer_gguf_gpu.gpu import GPU, gpu_errors
from anyformer_gguf_gpu.quants import FORMATS, QuantFormat

#: Threads per workgroup. 64 is a multiple of every vendor's SIMD width (32 NVIDIA, 64 AMD, 8-16 CPU).
WORKGROUP = 64
#: Threads of the argmax and sample kernels (one workgroup over the whole vocabulary).
ARGMAX_WORKGROUP = 256
#: Threads of the argmax kernel where the device allows workgroups this large (a shorter walk over the logits).
WIDE_ARGMAX_WORKGROUP = 1024
#: Threads of the attention kernel (one workgroup per head and token: more threads, shorter chains).
ATTENTION_WORKGROUP = 256
#: Largest workgroup count in one dimension (WebGPU's default limit).
MAX_GROUPS = 65535
#: Longest head the rope kernel's workgroup buffer holds.
MAX_HEAD_DIM = 512

_QUANT_FILES = {
    "F32": "quant_f32.wgsl",
    "F16": "quant_f16.wgsl",
    "BF16": "quant_bf16.wgsl",
    "Q4_0": "quant_q4_0.wgsl",
    "Q4_1": "quant_q4_1.wgsl",
    "Q8_0": "quant_q8_0.wgsl",
    "Q4_K": "quant_q4_k.wgsl",
    "Q5_K": "quant_q5_k.wgsl",
    "Q6_K": "quant_q6_k.wgsl",
}

#: The kernels that decode weights, compiled once per quant type an engine uses.
QUANT_KERNELS = ("matvec", "embed")
#: The samplers, which can also write the picked id's embedding row (compiled per embedding quant type then).
SAMPLERS = ("argmax", "sample")
#: The kernels that read or write the KV cache (its element type is a compile-time choice).
KV_KERNELS = ("rope_store", "attention", "attention_vec4")
#: The kernels that do not depend on a weight format.
PLAIN_KERNELS = (
    "rmsnorm",
    "rope_store",
    "attention",
    "attention_vec4",
    "attention_combine",
    "swiglu",
    "argmax",
    "sample",
    "delta_rule",
    "moe_combine",
)


def attention_kernel(head_dim: int) -> str:
    """The attention kernel for heads of ``head_dim``: the vec4 one where the width allows."""
    return "attention_vec4" if head_dim % 4 == 0 else "attention"


def _wgsl(name: str) -> str:
    return resources.files("anyformer_gguf_gpu").joinpath("wgsl", name).read_text(encoding="utf-8")


def kernel_source(
    kernel: str,
    quant: str | None = None,
    *,
    threads_per_row: int = 1,
    tokens_per_thread: int = 1,
    swiglu: bool = False,
    norm: bool = False,
    rope: bool = False,
    kv_f16: bool = False,
    subgroups: bool = False,
    workgroup: int | None = None,
    split: bool = False,
    gelu: bool = False,
) -> str:
    """The full WGSL of ``kernel`` (with the byte readers and ``quant``'s decoder for weight kernels).

    ``threads_per_row``, ``tokens_per_thread``, ``swiglu``, ``norm`` and ``rope`` shape the matrix kernel
    (matvec.wgsl; ``rope`` adds the q/k/v epilogue of rope_epilogue.wgsl, which writes the KV cache);
    ``kv_f16`` makes the KV-cache kernels keep f16 (it needs the shader-f16 feature); ``subgroups`` makes the
    matrix kernel reduce with subgroup shuffles; ``workgroup`` overrides the kernel's thread count (argmax);
    ``split`` makes the attention kernels cover one chunk of keys each and leave partial results; ``gelu``
    makes the matrix kernel's ``swiglu`` input gelu(gate) * up (GELU in its tanh form) instead of
    silu(gate) * up; a sampler given ``quant`` (the embedding table's) also writes the picked id's
    embedding row.
    """
    workgroup = workgroup or {
        "argmax": ARGMAX_WORKGROUP,
        "sample": ARGMAX_WORKGROUP,
        "attention": ATTENTION_WORKGROUP,
        "attention_vec4": ATTENTION_WORKGROUP,
    }.get(kernel, WORKGROUP)
    parts = [f"const WG: u32 = {workgroup}u;\n"]
    if kernel == "matvec":
        parts.append(
            f"const TPR: u32 = {threads_per_row}u;\nconst TB: u32 = {tokens_per_thread}u;\n"
            f"const SWIGLU: bool = {'true' if swiglu else 'false'};\n"
            f"const GELU: bool = {'true' if gelu and swiglu else 'false'};\n"
            f"const NORM: bool = {'true' if norm else 'false'};\n"
            f"const ROPE: bool = {'true' if rope else 'false'};\n"
            f"const SUBGROUPS: bool = {'true' if subgroups and threads_per_row > 1 else 'false'};\n"
        )
        parts.append(_NORM_W if norm else "fn norm_w(e: u32) -> f32 {\n    return 1.0;\n}\n")
        parts.append(_wgsl("rope_epilogue.wgsl") if rope else _NO_ROPE)
        parts.append(_LANES_SUM if subgroups and threads_per_row > 1 else _NO_LANES_SUM)
    if kernel in ("attention", "attention_vec4"):
        parts.append(_ATTENTION_SPLIT if split else _NO_ATTENTION_SPLIT)
    if kernel == "attention_combine":
        parts.append(f"const CHUNK: u32 = {ATTENTION_CHUNK}u;\n")
    if kernel == "delta_rule":
        parts.append(f"const MAX_HEAD: u32 = {MAX_HEAD_DIM}u;\n")
    if kernel == "attention_vec4":
        parts.append(f"const ROPE: bool = {'true' if rope else 'false'};\n")
        parts.append(_wgsl("attention_rope.wgsl") if rope else _NO_ATTENTION_ROPE)
    if kernel in KV_KERNELS or (kernel == "matvec" and rope):
        parts.insert(0, "enable f16;\nalias kv_t = f16;\n" if kv_f16 else "alias kv_t = f32;\n")
    if kernel in SAMPLERS:
        parts.append(_SAMPLER_EMBED if quant is not None else _NO_SAMPLER_EMBED)
    if kernel in QUANT_KERNELS or (kernel in SAMPLERS and quant is not None):
        if quant not in _QUANT_FILES:
            raise ValueError(f"no WGSL decoder for {quant}")
        parts.append(_wgsl("bytes.wgsl"))
        if quant in ("Q4_K", "Q5_K"):
            parts.append(_wgsl("quant_kscales.wgsl"))
        parts.append(_wgsl(_QUANT_FILES[quant]))
    source = _wgsl(f"{kernel}.wgsl")
    if kernel == "matvec":
        # The subgroup size is an entry-point input, declared only where the device has subgroups.
        param = "@builtin(subgroup_size) SUBGROUP_SIZE: u32," if subgroups and threads_per_row > 1 else ""
        source = source.replace("SUBGROUP_SIZE_PARAM", param)
    parts.append(source)
    return "\n".join(parts)


#: A buffer-to-buffer copy: (source, source offset, destination, destination offset, bytes).
Copy = tuple[Any, int, Any, int, int]

#: A pipeline variant: (kernel, quant, tokens_per_thread, swiglu, norm[, rope[, split[, gelu[, layout]]]]), the
#: arguments of :meth:`Kernels.pipeline` (an engine that never asks for the later ones may leave them out; matrix
#: keys come from :meth:`Kernels.matrix_key`, which knows the layout a matrix gets).
PipelineKey = tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class RopeStore:
    """Where the matrix kernel's rope epilogue writes: the layer's KV cache, the rope table, the step state."""

    k_cache: Any
    v_cache: Any
    cos_sin: Any
    state: Any
    head_dim: int
    n_rot: int
    q_dim: int
    kv_dim: int


@dataclasses.dataclass(frozen=True)
class AttentionRope:
    """What attention needs to do rope_store's work itself: the rope table and the q/k norms."""

    cos_sin: Any
    norm: Any
    n_rot: int
    neox: bool
    qk_norm: bool
    eps: float


@dataclasses.dataclass(frozen=True)
class EmbedNext:
    """Where a sampler writes the embedding row of the id it picked: the next decode step's input (row 0)."""

    weight: Any
    fmt: QuantFormat
    rows: int
    cols: int
    out: Any


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """One compute dispatch, ready to encode (or, made inside :meth:`Kernels.unbound`, not bound yet)."""

    name: str
    pipeline: Any
    bind_group: Any
    groups: tuple[int, int, int]
    #: The uniform block (shapes, offsets) and the storage buffers bound around it (None: a binding left out).
    params: bytes = b""
    buffers: tuple[Any, ...] = ()
    #: The binding number of the uniform block among the buffers.
    uniform_slot: int = 0
    #: What the native encoder passes (set from the fields above): the pipeline's and bind group's native
    #: handles (wgpu-py's ``_internal``) and the workgroup counts, or None where a handle is missing.
    native: tuple[Any, Any, int, int, int] | None = dataclasses.field(default=None, init=False, compare=False)

    def __post_init__(self) -> None:
        pipeline, group = getattr(self.pipeline, "_internal", None), getattr(self.bind_group, "_internal", None)
        native = None if pipeline is None or group is None else (pipeline, group, *self.groups)
        object.__setattr__(self, "native", native)


#: A buffer range's keys in a bind group entry.
_RANGE = ("buffer", "offset", "size")


@dataclasses.dataclass(frozen=True)
class NativePass:
    """wgpu-native's compute-pass functions as cffi exposes them, cffi's NULL, and wgpu-py's error handler."""

    set_pipeline: Any
    set_bind_group: Any
    dispatch: Any
    null: Any
    #: Collects what wgpu-native reports during the calls (capture / release), as wgpu-py's wrappers do per call.
    errors: Any


def _native_pass_calls() -> NativePass | None:
    """wgpu-native's set-pipeline, set-bind-group and dispatch functions, where importable.

    Encoding is the host's share of every token (~150 dispatches). wgpu-py's public methods check
    their arguments, build a cffi array for dynamic offsets and wrap each native call in an error
    capture (a thread-local stack push and pop, ~0.4 us a call); the raw functions skip all of that,
    and the encoder takes one error capture for a whole pass instead (:meth:`Kernels.encode`). This
    reaches into wgpu-py's backend module, so anything unexpected there means the public API is used.
    """
    try:
        from wgpu.backends.wgpu_native import _api as native  # type: ignore[import-untyped]

        lib, errors = native.lib, native.error_handler
        if not (callable(getattr(errors, "capture", None)) and callable(getattr(errors, "release", None))):
            return None
        return NativePass(
            lib.wgpuComputePassEncoderSetPipeline,
            lib.wgpuComputePassEncoderSetBindGroup,
            lib.wgpuComputePassEncoderDispatchWorkgroups,
            native.ffi.NULL,
            errors,
        )
    except (ImportError, AttributeError):
        return None


def _reported(kind: str, message: str) -> Exception:
    """The wgpu exception for an error wgpu-native reported (its kind as wgpu-py's error handler names it)."""
    import wgpu  # type: ignore[import-untyped]

    if kind == "OutOfMemory":
        return wgpu.GPUOutOfMemoryError(message)
    return wgpu.GPUValidationError(message) if kind == "Validation" else wgpu.GPUError(message)


def _groups_for_rows(rows: int, z: int = 1) -> tuple[int, int, int]:
    x = min(rows, MAX_GROUPS)
    return (x, math.ceil(rows / x), z)


#: Most logits the GPU sampler keeps (top-k is capped here).
MAX_TOP_K = 64


def sampling_block(temperature: float, top_k: int, top_p: float, seed: int) -> np.ndarray:
    """The 16 bytes the sample kernel reads: top_k (capped at MAX_TOP_K), seed, temperature, top_p."""
    k = MAX_TOP_K if top_k <= 0 else min(top_k, MAX_TOP_K)
    return np.frombuffer(struct.pack("<IIff", k, seed & 0xFFFFFFFF, temperature, top_p), dtype=np.uint8).copy()


def uniform01(seed: int, step: int) -> float:
    """The sample kernel's uniform draw for (seed, step), computed the same way on the host (for checks)."""
    m = 0xFFFFFFFF
    x = (seed * 747796405 + step * 2891336453 + 277803737) & m
    for _ in range(2):
        x = (((x >> ((x >> 28) + 4)) ^ x) * 277803737) & m
        x = (x >> 22) ^ x
        if _ == 0:
            x = (x * 747796405 + 2891336453) & m
    return (x >> 8) / 16777216.0


def _ring(rows: int) -> int:
    """A KV ring's row count for the kernels' params (0: no ring, a row per position)."""
    if rows < 0:
        raise ValueError(f"ring must be 0 (none) or positive, not {rows}")
    return rows


def _u32s(*values: int | float) -> bytes:
    """A uniform block: ints as u32, floats as f32, padded to a multiple of 16 bytes."""
    out = b"".join(struct.pack("<f", v) if isinstance(v, float) else struct.pack("<I", v) for v in values)
    return out + b"\0" * ((-len(out)) % 16)


#: Tokens each thread of the matrix kernel applies a decoded weight to, when a step covers several tokens.
#: 4, not 8: on an H200 (2026-12-01, 512-token prompts, threads a row 1-16 by tokens a thread 4/8/16) four
#: gave the fastest prefill at every width, 6010 against 4221 tok/s in SmolLM2's shapes and 2335 against
#: 1674 in Qwen3-0.6B's: fewer accumulators a thread leave room for more threads in flight.
PREFILL_TOKENS_PER_THREAD = 4
#: Most threads per row in the tiled (several-token) matrix kernel: its workgroup stages the tokens'
#: inputs once for all its rows, so it wants more rows per workgroup than decoding does.
PREFILL_THREADS_PER_ROW = 4


#: A matrix with at least this many rows (a vocabulary's head) is multiplied, one token at a time on a GPU, by
#: workgroups of 256 threads with 8 threads a row (32 rows a workgroup): on an H200 (2026-12-01,
#: ``bench/bench_matvec.py``) that took SmolLM2's 49152 x 576 Q4_1 head from 220 to 42 us and Qwen3-0.6B's
#: 151936 x 1024 one from 371 to 165 us, against 64 threads with 32 a row (Q4_K and Q8_0 alike).
WIDE_ROWS = 16384
#: Threads one token's product aims for on a GPU below WIDE_ROWS: a row gets the power of two of threads
#: nearest DECODE_THREADS / rows, from 16 to 64. Measured on the H200 the same day: 16 a row best for
#: 3072-6144 rows (gate|up, Qwen3's q/k/v: 17-20 % faster than 32), 64 for 576-1024 rows (the output and down
#: projections: 2-14 % faster); wall-clock a dispatch there is 9-25 us, most of it the dispatch's fixed cost.
DECODE_THREADS = 65536


def decode_layout(rows: int, *, rope: bool = False) -> tuple[int, int]:
    """(threads a workgroup, threads a row) of a one-token product over ``rows`` rows on a GPU.

    A workgroup always holds an even number of rows with ``rope`` (the epilogue rotates row pairs).
    """
    if rows >= WIDE_ROWS:
        return 256, 8
    tpr = 2 ** round(math.log2(DECODE_THREADS / max(1, rows)))
    tpr = min(64, max(16, tpr))
    return (128 if rope and tpr == WORKGROUP else WORKGROUP), tpr


#: A matrix with at least this many rows is multiplied over several tokens on a GPU by workgroups of 256 threads
#: with 2 a row (128 rows a workgroup share each staged input): on an H200 (2026-12-01, ``bench/bench_matvec.py
#: --tokens 64``) that took 64-token products of 3072-6144 rows 1.5-4.6x faster than 64 threads with 4 a row
#: (SmolLM2's gate|up 351 -> 128 us, Qwen3-0.6B's q/k/v 402 -> 172 us, its Q4_K gate|up 947 -> 207 us); below it the
#: 64/4 shape was as fast as any (narrower matrices have too few rows to fill 128-row workgroups).
PREFILL_WIDE_ROWS = 2048


def prefill_layout(rows: int, threads_per_row: int) -> tuple[int, int]:
    """(threads a workgroup, threads a row) of a several-token product over ``rows`` rows on a GPU."""
    if rows >= PREFILL_WIDE_ROWS:
        return 256, 2
    return WORKGROUP, threads_per_row


def default_threads_per_row(gpu: GPU) -> int:
    """1 on a CPU adapter (no barriers: lavapipe runs each workgroup on one core), 32 on a GPU."""
    from anyformer_gguf_gpu.gpu import is_software

    return 1 if is_software(gpu.info) else 32


class Kernels:
    """Compiles the kernels on one GPU and builds dispatches over an engine's buffers."""

    def __init__(
        self,
        gpu: GPU,
        *,
        threads_per_row: int | None = None,
        kv_f16: bool = False,
        subgroups: bool | None = None,
        layout_per_matrix: bool | None = None,
    ) -> None:
        self.gpu = gpu
        if kv_f16 and not gpu.has_f16:
            raise ValueError("an f16 KV cache needs the adapter's shader-f16 feature")
        #: Whether the KV cache holds f16 (2 bytes a value) rather than f32.
        self.kv_f16 = kv_f16
        tpr = default_threads_per_row(gpu) if threads_per_row is None else threads_per_row
        if tpr < 1 or tpr > WORKGROUP or tpr & (tpr - 1):
            raise ValueError(f"threads_per_row must be a power of two up to {WORKGROUP}, not {tpr}")
        self.threads_per_row = tpr
        #: Whether products pick their shape per matrix (decode_layout, prefill_layout): by default on a GPU unless
        #: the caller fixed the threads a row. A CPU adapter keeps one thread a row (no barriers).
        per_matrix = threads_per_row is None and tpr > 1
        self.layout_per_matrix = per_matrix if layout_per_matrix is None else layout_per_matrix
        #: Threads per row of the tiled matrix kernel (steps of several tokens).
        self.prefill_threads_per_row = min(tpr, PREFILL_THREADS_PER_ROW)
        if subgroups and not gpu.has_subgroups:
            raise ValueError("subgroup reductions need the adapter's subgroup feature")
        #: Whether the matrix kernel sums rows with subgroup shuffles (any subgroup size: the kernel reads it).
        self.subgroups = (gpu.has_subgroups and tpr > 1) if subgroups is None else subgroups
        wide = all(
            int(gpu.limits.get(k, 0)) >= WIDE_ARGMAX_WORKGROUP
            for k in ("max-compute-invocations-per-workgroup", "max-compute-workgroup-size-x")
        )
        #: Threads of the argmax kernel's one workgroup.
        self.argmax_workgroup = WIDE_ARGMAX_WORKGROUP if wide else ARGMAX_WORKGROUP
        #: Host time spent encoding (until the command buffer is finished) and submitting, and submissions
        #: made: what a bench reports as the CPU cost per token.
        self.encode_seconds = 0.0
        self.submit_seconds = 0.0
        self.submissions = 0
        self._pipelines: dict[PipelineKey, Any] = {}
        #: Inside :meth:`unbound`: the kernel methods return dispatches without a bind group or uniform buffer.
        self._unbound = 0
        #: wgpu-native's pass functions, called directly when encoding (None: wgpu-py's public API).
        self.native_calls = _native_pass_calls()

    def rows_threads(self, tokens_per_thread: int) -> int:
        """Threads per row of the matrix kernel's variant for ``tokens_per_thread`` (where the shape is not
        chosen per matrix: see :meth:`matrix_layout`)."""
        return self.threads_per_row if tokens_per_thread == 1 else self.prefill_threads_per_row

    def matrix_layout(self, rows: int, tokens_per_thread: int, *, rope: bool = False) -> tuple[int, int]:
        """(threads a workgroup, threads a row) of the matrix kernel over ``rows`` rows: chosen per matrix on a GPU
        (:func:`decode_layout` for one-token products, :func:`prefill_layout` for the tiled ones), fixed otherwise."""
        if self.layout_per_matrix:
            if tokens_per_thread == 1:
                return decode_layout(rows, rope=rope)
            return prefill_layout(rows, self.prefill_threads_per_row)
        return WORKGROUP, self.rows_threads(tokens_per_thread)

    def matrix_key(
        self,
        quant: str,
        rows: int,
        tokens: int,
        *,
        swiglu: bool = False,
        norm: bool = False,
        rope: bool = False,
        gelu: bool = False,
    ) -> PipelineKey:
        """The pipeline key :meth:`matvec` compiles for these arguments (for an engine's list compiled at load)."""
        tb = self.tokens_per_thread(tokens)
        layout = self.matrix_layout(rows, tb, rope=rope)
        return ("matvec", quant, tb, swiglu, norm, rope, False, gelu and swiglu, layout)

    @staticmethod
    def tokens_per_thread(tokens: int) -> int:
        """The matrix kernel's variant for a step over ``tokens`` tokens."""
        return 1 if tokens == 1 else PREFILL_TOKENS_PER_THREAD

    def compile(
        self,
        wanted: Iterable[PipelineKey],
        progress: Callable[[int, int], None] | None = None,
        *,
        also: Sequence[Callable[[], Any]] = (),
    ) -> None:
        """Compile every (kernel, quant, tokens_per_thread, swiglu, norm, rope[, split[, gelu]]) pipeline in
        ``wanted`` now.

        ``also`` are other pipelines' compilations (a kernel of an engine's own, as lfm2's convolution),
        run first and counted in the same progress.
        """
        todo: list[Callable[[], Any]] = list(also)
        todo += [functools.partial(self.pipeline, *key) for key in dict.fromkeys(wanted) if key not in self._pipelines]
        for done, job in enumerate(todo, 1):
            job()
            if progress is not None:
                progress(done, len(todo))

    @contextlib.contextmanager
    def unbound(self) -> Iterator[None]:
        """Inside the block the kernel methods return dispatches with no bind group and no uniform buffer of
        their own (their ``params`` and ``buffers`` kept), for :class:`~anyformer_gguf_gpu.programs.BoundProgram`
        to bind once at load, or to take a step's shape from."""
        self._unbound += 1
        try:
            yield
        finally:
            self._unbound -= 1

    def pipeline(
        self,
        kernel: str,
        quant: str | None = None,
        tokens_per_thread: int = 1,
        swiglu: bool = False,
        norm: bool = False,
        rope: bool = False,
        split: bool = False,
        gelu: bool = False,
        layout: tuple[int, int] | None = None,
    ) -> Any:
        """The compute pipeline of ``kernel`` (for ``quant`` where it decodes weights), compiled once.

        ``layout`` is the matrix kernel's (threads a workgroup, threads a row); by default the fixed one for
        ``tokens_per_thread`` (:meth:`rows_threads`).
        """
        matrix = kernel == "matvec"
        if matrix and layout is None:
            layout = (WORKGROUP, self.rows_threads(tokens_per_thread))
        key: PipelineKey = (
            kernel,
            quant if kernel in QUANT_KERNELS or kernel in SAMPLERS else None,
            tokens_per_thread if matrix else 1,
            swiglu and matrix,
            norm and matrix,
            rope and kernel in ("matvec", "attention_vec4"),
            split and kernel in ("attention", "attention_vec4"),
            gelu and swiglu and matrix,
            layout if matrix else None,
        )
        found = self._pipelines.get(key)
        if found is None:
            device = self.gpu.device
            source = kernel_source(
                key[0],
                key[1],
                threads_per_row=layout[1] if layout is not None else 1,
                tokens_per_thread=key[2],
                swiglu=key[3],
                norm=key[4],
                rope=key[5],
                kv_f16=self.kv_f16,
                subgroups=self.subgroups,
                workgroup=self.argmax_workgroup if kernel == "argmax" else (layout[0] if layout else None),
                split=key[6],
                gelu=key[7],
            )
            with gpu_errors(f"compiling the {kernel} kernel"):
                module = device.create_shader_module(code=source, label=f"{kernel}-{quant}")
                found = device.create_compute_pipeline(
                    layout="auto", compute={"module": module, "entry_point": "main"}, label=f"{kernel}-{quant}"
                )
            self._pipelines[key] = found
        return found

    def dispatch(
        self,
        name: str,
        pipeline: Any,
        buffers: Sequence[Any],
        params: bytes,
        groups: tuple[int, int, int],
        uniform_slot: int | None = None,
    ) -> Dispatch:
        """A dispatch of ``pipeline`` over ``buffers`` with the uniform block ``params`` at binding ``uniform_slot``
        (the kernel's own slot by default); None in ``buffers`` marks a binding a variant does not declare.

        Bound now with a uniform buffer of its own, or left unbound inside :meth:`unbound`.
        """
        slot = _UNIFORM_SLOT[name] if uniform_slot is None else uniform_slot
        spec = Dispatch(name, pipeline, None, groups, params, tuple(buffers), slot)
        if self._unbound:
            return spec
        uniform = self.gpu.upload(np.frombuffer(params, dtype=np.uint8), label=f"{name}-params", uniform=True)
        return self.bind(spec, uniform, 0)

    def bind(self, spec: Dispatch, uniform: Any, offset: int) -> Dispatch:
        """``spec`` bound: its buffers, and its uniform block read from ``uniform`` at byte ``offset``."""
        entries: list[Any] = []
        # The uniform sits at the binding after the kernel's first storage buffers (see each .wgsl).
        slots: list[Any] = list(spec.buffers)
        slots.insert(spec.uniform_slot, (uniform, offset, len(spec.params)))
        for index, buf in enumerate(slots):
            if buf is None:
                continue
            whole = not isinstance(buf, tuple)
            where = {"buffer": buf, "offset": 0, "size": buf.size} if whole else dict(zip(_RANGE, buf, strict=True))
            entries.append({"binding": index, "resource": where})
        pipeline = spec.pipeline
        with gpu_errors(f"binding the {spec.name} kernel"):
            group = self.gpu.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
        return dataclasses.replace(spec, bind_group=group)

    def matvec(
        self,
        weight: Any,
        fmt: QuantFormat,
        rows: int,
        cols: int,
        x: Any,
        y: Any,
        *,
        tokens: int = 1,
        x_off: int = 0,
        x_stride: int | None = None,
        y_off: int = 0,
        y_stride: int | None = None,
        accumulate: bool = False,
        swiglu: bool = False,
        gelu: bool = False,
        norm: Any = None,
        eps: float = 1e-5,
        rope: RopeStore | None = None,
    ) -> Dispatch:
        """y[t, :rows] (+)= W @ x[t, :cols] for ``tokens`` tokens; offsets and strides count floats.

        With ``swiglu`` each input row is [gate | up] (2 × cols floats, the default stride) and the
        vector multiplied is silu(gate) * up (with ``gelu`` too, gelu(gate) * up, GELU's tanh form,
        Gemma's). With ``norm`` (a buffer of cols f32 weights) it is
        RMSNorm(x) * norm, computed in the same dispatch. With ``rope`` the rows are a stacked
        [q | k | v] projection: q and k are rotated (adjacent pairs) and k, v stored into the cache
        at position state[0] + t, in the same dispatch (not with ``accumulate``).
        """
        if gelu and not swiglu:
            raise ValueError("gelu is the gate activation of a swiglu input: it needs swiglu")
        tb = self.tokens_per_thread(tokens)
        layout = self.matrix_layout(rows, tb, rope=rope is not None)
        rows_per_group = layout[0] // layout[1]
        if rope is not None:
            if accumulate or rows_per_group % 2 or rope.head_dim % 2 or rope.n_rot % 2 or rope.n_rot > rope.head_dim:
                raise ValueError("the rope epilogue needs row pairs in a workgroup, even head_dim and n_rot")
            if rows != rope.q_dim + 2 * rope.kv_dim:
                raise ValueError(f"the rope epilogue needs q_dim + 2 kv_dim rows, not {rows}")
        params = _u32s(
            rows,
            cols,
            fmt.row_bytes(cols) if fmt.block_size > 1 else cols * fmt.type_size,
            math.ceil(cols / 8),
            x_off,
            (2 * cols if swiglu else cols) if x_stride is None else x_stride,
            y_off,
            rows if y_stride is None else y_stride,
            int(accumulate),
            tokens,
            float(eps),
            0,
            *((rope.head_dim, rope.n_rot, rope.q_dim, rope.kv_dim) if rope is not None else (0, 0, 0, 0)),
        )
        buffers = [weight, x, y, norm]
        if rope is not None:
            buffers += [rope.k_cache, rope.v_cache, rope.cos_sin, rope.state]
        while buffers[-1] is None:
            buffers.pop()
        return self.dispatch(
            "matvec",
            self.pipeline("matvec", fmt.name, tb, swiglu, norm is not None, rope is not None, gelu=gelu, layout=layout),
            buffers,
            params,
            _groups_for_rows(math.ceil(rows / rows_per_group), math.ceil(tokens / tb)),
        )

    def embed(
        self,
        weight: Any,
        fmt: QuantFormat,
        rows: int,
        cols: int,
        ids: Any,
        y: Any,
        state: Any,
        tokens: int,
        *,
        scale: float = 1.0,
    ) -> Dispatch:
        """y[t, :] = the dequantised row ids[pos + t] of the embedding table times ``scale`` (Gemma's
        sqrt(n_embd)), for ``tokens`` tokens."""
        row_bytes = fmt.row_bytes(cols) if fmt.block_size > 1 else cols * fmt.type_size
        params = _u32s(cols, row_bytes, math.ceil(cols / 8), rows, float(scale))
        return self.dispatch("embed", self.pipeline("embed", fmt.name), [weight, ids, y, state], params, (tokens, 1, 1))

    def rmsnorm(
        self,
        x: Any,
        weight: Any,
        y: Any,
        n: int,
        eps: float,
        *,
        tokens: int = 1,
        x_off: int = 0,
        x_stride: int | None = None,
        accumulate: bool = False,
        scale: float = 1.0,
    ) -> Dispatch:
        """y[t, :n] = RMSNorm(x[t, :n]) * weight for ``tokens`` rows (y is packed, stride n).

        With ``accumulate`` the norm is added to y (a residual: Gemma's post-attention and post-FFN
        norms), and the sum is then multiplied by ``scale`` (Gemma 4's layer output scale).
        """
        params = _u32s(n, n if x_stride is None else x_stride, n, float(eps), x_off, int(accumulate), float(scale))
        return self.dispatch("rmsnorm", self.pipeline("rmsnorm"), [x, weight, y], params, (tokens, 1, 1))

    def rope_store(
        self,
        qkv: Any,
        k_cache: Any,
        v_cache: Any,
        cos_sin: Any,
        norm: Any,
        state: Any,
        *,
        n_head: int,
        n_kv: int,
        head_dim: int,
        n_rot: int,
        neox: bool,
        tokens: int = 1,
        qk_norm: bool = False,
        eps: float = 1e-6,
        v_norm: bool = False,
        q_stride: int | None = None,
        ring: int = 0,
    ) -> Dispatch:
        """Rotate q and k in the packed [q | k | v] rows (optionally RMS-norming each head first) and store k, v.

        With ``v_norm`` each v head is RMS-normalised (no weight: Gemma 4's) before it is stored. Query head h
        starts at h * ``q_stride`` (head_dim by default; 2 head_dim where each query is followed by its output
        gate, qwen35moe's), so the q part of a row is n_head * q_stride wide. A ``ring`` above 0 stores
        position p at cache row p % ring (a sliding-window layer's cache of ``ring`` rows; see :meth:`attention`).
        """
        if head_dim > MAX_HEAD_DIM:
            raise ValueError(f"head_dim {head_dim} is over {MAX_HEAD_DIM}")
        q_stride = head_dim if q_stride is None else q_stride
        if q_stride < head_dim:
            raise ValueError(f"q_stride {q_stride} is below head_dim {head_dim}")
        q_dim, kv_dim = n_head * q_stride, n_kv * head_dim
        params = _u32s(
            n_head,
            n_kv,
            head_dim,
            n_rot,
            q_dim + 2 * kv_dim,
            q_dim,
            q_dim + kv_dim,
            kv_dim,
            int(neox),
            int(qk_norm),
            float(eps),
            head_dim,
            int(v_norm),
            q_stride,
            _ring(ring),
        )
        return self.dispatch(
            "rope_store",
            self.pipeline("rope_store"),
            [qkv, k_cache, v_cache, cos_sin, norm, state],
            params,
            (n_head + 2 * n_kv, tokens, 1),
        )

    def attention(
        self,
        qkv: Any,
        k_cache: Any,
        v_cache: Any,
        out: Any,
        scores: Any,
        state: Any,
        *,
        n_head: int,
        n_kv: int,
        head_dim: int,
        ctx: int,
        scale: float,
        tokens: int = 1,
        split: bool = False,
        window: int = 0,
        gated: bool = False,
        ring: int = 0,
    ) -> Dispatch:
        """out[t, h*hd:(h+1)*hd] = causal softmax(q k^T * scale) v over the cache, for every head and token.

        Heads whose width is a multiple of 4 use the kernel that reads the caches a vec4 at a time.
        ``scores`` holds :func:`attention_scratch_bytes` for the engine's largest step. With ``split``
        each workgroup covers :data:`ATTENTION_CHUNK` keys of one head and leaves a partial result in
        ``scores``; :meth:`attention_combine` (the next dispatch) writes ``out``. A ``window`` above 0
        is sliding-window attention: the token at position p sees keys p - window + 1 .. p only. With
        ``gated`` each query head is followed by its output gate in the q/k/v rows (q heads 2 head_dim
        apart, qwen35moe's) and the output is scaled by sigmoid(gate) (not with ``split``). A ``ring`` above 0
        reads position p's keys and values at cache row p % ring: a sliding layer's cache of ``ring`` rows, not
        ``ctx``, which holds every key the window shows while ring >= window + tokens - 1 (the step's own
        tokens, stored first, must not overwrite the keys its first token still sees).
        """
        dims = {"n_head": n_head, "n_kv": n_kv, "head_dim": head_dim, "ctx": ctx, "tokens": tokens, "window": window}
        return self._attention(
            qkv, k_cache, v_cache, out, scores, state, scale=scale, rope=None, split=split, gated=gated, ring=ring,
            **dims,
        )  # fmt: skip

    def attention_with_rope(
        self,
        rope: AttentionRope | None,
        qkv: Any,
        k_cache: Any,
        v_cache: Any,
        out: Any,
        scores: Any,
        state: Any,
        *,
        n_head: int,
        n_kv: int,
        head_dim: int,
        ctx: int,
        scale: float,
        tokens: int = 1,
        split: bool = False,
        window: int = 0,
        ring: int = 0,
    ) -> Dispatch:
        """:meth:`attention` that first norms and rotates q and k as rope_store does and stores k, v into the
        cache, in the same dispatch (heads a multiple of 4 wide). The keys of the step's earlier tokens come
        from the q/k/v rows (normed and rotated again where used), not from the cache being written. With
        ``rope`` None it is :meth:`attention` (q and k rotated and stored by an earlier dispatch)."""
        dims = {"n_head": n_head, "n_kv": n_kv, "head_dim": head_dim, "ctx": ctx, "tokens": tokens, "window": window}
        return self._attention(
            qkv, k_cache, v_cache, out, scores, state, scale=scale, rope=rope, split=split, gated=False, ring=ring,
            **dims,
        )  # fmt: skip

    def _attention(
        self,
        qkv: Any,
        k_cache: Any,
        v_cache: Any,
        out: Any,
        scores: Any,
        state: Any,
        *,
        n_head: int,
        n_kv: int,
        head_dim: int,
        ctx: int,
        scale: float,
        tokens: int,
        rope: AttentionRope | None,
        split: bool,
        window: int,
        gated: bool,
        ring: int,
    ) -> Dispatch:
        if gated and split:
            raise ValueError("the output gate is applied by the unsplit attention kernel only")
        q_stride = 2 * head_dim if gated else head_dim
        q_dim, kv_dim = n_head * q_stride, n_kv * head_dim
        name = attention_kernel(head_dim)
        part_off = _partials_offset(scores, tokens, n_head, ctx, head_dim) if split else 0
        extra: tuple[int | float, ...] = (0, 0, 0, 0.0, 0, q_dim, q_dim + kv_dim, part_off)
        buffers = [qkv, k_cache, v_cache, out, scores, state]
        if rope is not None:
            if name != "attention_vec4" or head_dim > MAX_HEAD_DIM or rope.n_rot > head_dim:
                raise ValueError("attention rotates q/k itself only for heads a multiple of 4 wide")
            extra = (
                rope.n_rot,
                int(rope.neox),
                int(rope.qk_norm),
                float(rope.eps),
                head_dim,
                q_dim,
                q_dim + kv_dim,
                part_off,
            )
            buffers += [rope.cos_sin, rope.norm]
        if window < 0:
            raise ValueError(f"window must be 0 (none) or positive, not {window}")
        if _ring(ring) and not 0 < window <= ring:
            raise ValueError(f"a ring of {ring} rows holds a window of 1..{ring} keys, not {window}")
        out_stride = n_head * head_dim
        params = _u32s(
            n_head, n_kv, head_dim, q_dim + 2 * kv_dim, kv_dim, ctx, out_stride, float(scale), *extra, window,
            q_stride, int(gated), ring,
        )  # fmt: skip
        return self.dispatch(
            name,
            self.pipeline(name, rope=rope is not None, split=split),
            buffers,
            params,
            (n_head, tokens, attention_chunks(ctx) if split else 1),
        )

    def attention_combine(
        self, scores: Any, out: Any, state: Any, *, n_head: int, head_dim: int, ctx: int, tokens: int = 1
    ) -> Dispatch:
        """out[t, h*hd:(h+1)*hd] from the partial results a ``split`` :meth:`attention` left in ``scores``."""
        part_off = _partials_offset(scores, tokens, n_head, ctx, head_dim)
        params = _u32s(n_head, head_dim, n_head * head_dim, ctx, part_off)
        return self.dispatch(
            "attention_combine",
            self.pipeline("attention_combine"),
            [scores, out, state],
            params,
            (n_head, tokens, 1),
        )

    def delta_rule(
        self,
        x: Any,
        proj: Any,
        vecs: Any,
        state: Any,
        out: Any,
        pos_state: Any,
        *,
        k_heads: int,
        v_heads: int,
        head_dim: int,
        z_off: int,
        beta_off: int,
        alpha_off: int,
        eps: float,
    ) -> Dispatch:
        """One token of a gated delta net (see ``wgsl/delta_rule.wgsl``), a workgroup per value head.

        ``x`` holds the convolved [q | k | v] channels; ``proj`` the output gate z, beta and alpha at the given
        float offsets; ``vecs`` dt (v_heads), a (v_heads) and the per-head norm weights (head_dim); ``state``
        v_heads state matrices of head_dim × head_dim f32, updated in place (zeros at position 0); ``out``
        the normalised, gated output (v_heads × head_dim).
        """
        if head_dim > MAX_HEAD_DIM or v_heads % k_heads:
            raise ValueError(f"delta-net heads of {head_dim} (at most {MAX_HEAD_DIM}), {v_heads} over {k_heads}")
        params = _u32s(k_heads, v_heads, head_dim, z_off, beta_off, alpha_off, float(eps), 0)
        return self.dispatch(
            "delta_rule",
            self.pipeline("delta_rule"),
            [x, proj, vecs, state, out, pos_state],
            params,
            (v_heads, 1, 1),
        )

    def swiglu(self, gate_up: Any, y: Any, n: int, *, tokens: int = 1) -> Dispatch:
        """y[t, i] = silu(gate_up[t, i]) * gate_up[t, n + i]."""
        params = _u32s(n, tokens)
        return self.dispatch(
            "swiglu", self.pipeline("swiglu"), [gate_up, y], params, (math.ceil(n / WORKGROUP), tokens, 1)
        )

    def moe_combine(self, src: Any, table: Any, h: Any, n: int, m: int, *, tokens: int) -> Dispatch:
        """h[t, :n] += sum_j w * src[row, :n] over the ``m`` (row, weight) entries of token t in ``table``.

        ``table`` holds, per token, ``m`` pairs of u32 words: the source row, then the weight's f32 bits
        (:func:`combine_table`); the terms are added in table order, then to h (a mixture of experts'
        weighted outputs added back to each token's residual, as llama.cpp sums them).
        """
        params = _u32s(n, m)
        groups = (math.ceil(n / WORKGROUP), tokens, 1)
        return self.dispatch("moe_combine", self.pipeline("moe_combine"), [src, table, h], params, groups)

    def argmax(
        self, logits: Any, ids: Any, state: Any, n: int, *, offset: int = 0, embed: EmbedNext | None = None
    ) -> Dispatch:
        """ids[pos + n_batch] = argmax(logits[offset : offset + n]), the lowest index on a tie.

        With ``embed`` the id's embedding row is also written to ``embed.out`` (the next step's input).
        """
        buffers = [logits, ids, state, *_embed_buffers(embed)]
        return self._sampler("argmax", buffers, n, offset, embed)

    def sample(
        self,
        logits: Any,
        ids: Any,
        state: Any,
        sampling: Any,
        n: int,
        *,
        offset: int = 0,
        embed: EmbedNext | None = None,
    ) -> Dispatch:
        """ids[pos + n_batch] = a top-k / top-p draw at a temperature from logits[offset : offset + n].

        ``sampling`` holds (top_k, seed, temperature, top_p) as written by :func:`sampling_block`; ``embed``
        as for :meth:`argmax`.
        """
        return self._sampler("sample", [logits, ids, state, sampling, *_embed_buffers(embed)[1:]], n, offset, embed)

    def _sampler(self, name: str, buffers: list[Any], n: int, offset: int, embed: EmbedNext | None) -> Dispatch:
        shape = (0, 0, 0, 0)
        if embed is not None:
            fmt = embed.fmt
            row_bytes = fmt.row_bytes(embed.cols) if fmt.block_size > 1 else embed.cols * fmt.type_size
            shape = (embed.cols, row_bytes, math.ceil(embed.cols / 8), embed.rows)
        pipeline = self.pipeline(name, None if embed is None else embed.fmt.name)
        return self.dispatch(name, pipeline, buffers, _u32s(n, offset, *shape), (1, 1, 1))

    def run(self, dispatches: Sequence[Dispatch], copies: Sequence[Copy] = ()) -> None:
        """Encode ``dispatches`` in one compute pass, then ``copies`` (src, src_off, dst, dst_off, n); submit once."""
        self.run_passes([((), dispatches)], copies)

    def run_passes(
        self, passes: Sequence[tuple[Sequence[Copy], Sequence[Dispatch]]], copies: Sequence[Copy] = ()
    ) -> None:
        """Encode each (copies before it, dispatches) as its own compute pass, then ``copies``; submit once.

        Several decode steps go in one submission this way, each pass preceded by the copy that sets its position.
        """
        start = time.perf_counter()
        with gpu_errors("running the kernels"):
            commands = self.encode(passes, copies)
            encoded = time.perf_counter()
            self.gpu.device.queue.submit([commands])
        self.encode_seconds += encoded - start
        self.submit_seconds += time.perf_counter() - encoded
        self.submissions += 1

    def encode(self, passes: Sequence[tuple[Sequence[Copy], Sequence[Dispatch]]], copies: Sequence[Copy] = ()) -> Any:
        """The command buffer :meth:`run_passes` submits (wgpu's exceptions are the caller's to turn)."""
        encoder = self.gpu.device.create_command_encoder()
        for before, dispatches in passes:
            for src, src_off, dst, dst_off, n in before:
                encoder.copy_buffer_to_buffer(src, src_off, dst, dst_off, n)
            compute = encoder.begin_compute_pass()
            native = getattr(compute, "_internal", None) if self.native_calls is not None else None
            if native is not None and self.native_calls is not None:
                _encode_native(self.native_calls, compute, native, dispatches)
            else:
                for d in dispatches:
                    compute.set_pipeline(d.pipeline)
                    compute.set_bind_group(0, d.bind_group)
                    compute.dispatch_workgroups(*d.groups)
            compute.end()
        for src, src_off, dst, dst_off, n in copies:
            encoder.copy_buffer_to_buffer(src, src_off, dst, dst_off, n)
        return encoder.finish()


def _encode_native(calls: NativePass, compute: Any, native: Any, dispatches: Sequence[Dispatch]) -> None:
    """Encode ``dispatches`` into the pass through wgpu-native's functions, under one error capture."""
    set_pipeline, set_group, dispatch, null = calls.set_pipeline, calls.set_bind_group, calls.dispatch, calls.null
    calls.errors.capture("anyformer-encode")
    try:
        for d in dispatches:
            handles = d.native
            if handles is None:
                compute.set_pipeline(d.pipeline)
                compute.set_bind_group(0, d.bind_group)
                compute.dispatch_workgroups(*d.groups)
                continue
            # One tuple per dispatch, unpacked: indexing and a starred call cost a third of this loop.
            pipeline, group, x, y, z = handles
            set_pipeline(native, pipeline)
            set_group(native, 0, group, 0, null)
            dispatch(native, x, y, z)
    finally:
        failed = calls.errors.release("anyformer-encode")
    if failed is not None:
        raise _reported(*failed)


def combine_table(rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The table :meth:`Kernels.moe_combine` reads: ``rows`` and ``weights`` (tokens x m) interleaved as u32 words."""
    if rows.shape != weights.shape or rows.ndim != 2:
        raise ValueError(f"rows {rows.shape} and weights {weights.shape} must be the same tokens x m shape")
    out = np.empty((*rows.shape, 2), dtype=np.uint32)
    out[..., 0] = rows
    out[..., 1] = np.asarray(weights, dtype=np.float32).view(np.uint32)
    return out.reshape(-1)


def _partials_offset(scores: Any, tokens: int, n_head: int, ctx: int, head_dim: int) -> int:
    """Where the partial results start in the attention scratch (in floats): after every step token's scores.

    The scratch holds attention_scratch_bytes(max_tokens, ...) for the engine's largest step; its size
    says how many tokens that is.
    """
    per_token = attention_scratch_bytes(1, n_head, ctx, head_dim)
    max_tokens = scores.size // per_token
    if max_tokens < tokens:
        raise ValueError(f"the attention scratch holds {scores.size} bytes, not {per_token} per token for {tokens}")
    return max_tokens * n_head * ctx


# The attention kernels' SPLIT variant: one chunk of keys per workgroup (z), partial results after the scores.
_ATTENTION_SPLIT = f"""const SPLIT: bool = true;
const CHUNK: u32 = {ATTENTION_CHUNK}u;

fn partial_base(b: u32, h: u32, c: u32) -> u32 {{
    let chunks = (P.ctx + CHUNK - 1u) / CHUNK;
    return P.part_off + ((b * P.n_head + h) * chunks + c) * (P.head_dim + 2u);
}}

fn partial_out(i: u32, v: f32) {{
    Sc[i] = v;
}}
"""

# Without the split (SPLIT is false): one workgroup per head covers every key.
_NO_ATTENTION_SPLIT = """const SPLIT: bool = false;
const CHUNK: u32 = 4294967295u;

fn partial_base(b: u32, h: u32, c: u32) -> u32 {
    return 0u;
}

fn partial_out(i: u32, v: f32) {
}
"""


def _embed_buffers(embed: EmbedNext | None) -> list[Any]:
    """A sampler's bindings after its own: (none at 4 for argmax,) the embedding table at 5, its output at 6."""
    return [] if embed is None else [None, embed.weight, embed.out]


# A sampler's EMBED variant: the picked id's embedding row (decoded by the prepended quant reader) into Y.
_SAMPLER_EMBED = """const EMBED: bool = true;
@group(0) @binding(5) var<storage, read> W: array<u32>;
@group(0) @binding(6) var<storage, read_write> Y: array<f32>;

fn embed_row(id: u32, lid: u32) {
    // An id out of range (never from the sampler itself) reads row 0 rather than past the table.
    let rb = select(0u, id, id < P.e_rows) * P.e_row_bytes;
    for (var u = lid; u < P.e_units; u += WG) {
        let e0 = u * 8u;
        let w = unit_w(rb, e0, P.e_cols);
        for (var i = 0u; i < 8u; i++) {
            if (e0 + i < P.e_cols) {
                Y[e0 + i] = w[i / 4u][i % 4u];
            }
        }
    }
}
"""

# A sampler without it (EMBED is false; the function only has to exist).
_NO_SAMPLER_EMBED = """const EMBED: bool = false;

fn embed_row(id: u32, lid: u32) {
}
"""

# The matrix kernel's NORM variant: the norm weights' binding (after the uniform) and their reader.
_NORM_W = """@group(0) @binding(4) var<storage, read> NormW: array<f32>;

fn norm_w(e: u32) -> f32 {
    return NormW[min(e, P.cols - 1u)];
}
"""

# The matrix kernel's SUBGROUPS variant: the sum over a row's lanes within one subgroup, by shuffles.
_LANES_SUM = """fn lanes_sum(v: f32, sg: u32) -> f32 {
    var s = v;
    for (var off = min(TPR, sg) / 2u; off > 0u; off >>= 1u) {
        s += subgroupShuffleXor(s, off);
    }
    return s;
}
"""

# Without subgroups (SUBGROUPS is false; the function and the size only have to exist).
_NO_LANES_SUM = """const SUBGROUP_SIZE: u32 = 1u;

fn lanes_sum(v: f32, sg: u32) -> f32 {
    return v;
}
"""

# The matrix kernel without the rope epilogue (ROPE is false; the function only has to exist).
_NO_ROPE = """fn rope_epilogue(row: u32, local_row: u32, t: u32, token: u32, value: f32) -> f32 {
    return value;
}
"""

# attention_vec4 without the rotary prologue (ROPE is false; the function and buffer only have to exist).
_NO_ATTENTION_ROPE = """var<workgroup> cur: array<f32, 4>;

fn rope_head(src: u32, norm_off: u32, pos: u32, lid: u32) {
}

fn step_key_dot(src: u32, pos: u32) -> f32 {
    return 0.0;
}
"""

# Where each kernel's uniform binding sits among its bindings (after the buffers it reads and writes).
_UNIFORM_SLOT = {
    "sample": 2,
    "matvec": 3,
    "embed": 3,
    "rmsnorm": 3,
    "rope_store": 5,
    "attention": 5,
    "attention_vec4": 5,
    "attention_combine": 2,
    "swiglu": 2,
    "argmax": 2,
    "delta_rule": 5,
    "moe_combine": 3,
}

assert set(_UNIFORM_SLOT) == set(QUANT_KERNELS) | set(PLAIN_KERNELS)
assert {f.name for f in FORMATS.values()} == set(_QUANT_FILES)
