"""The anyformer hooks of the llama.cpp backend. Nothing heavy is imported here: llama_cpp loads in ``load``."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from anyformer.plugin import (
    AnyformerError,
    Caps,
    Estimate,
    GGUFCandidate,
    Model,
    ModelFile,
    ProgressCallback,
    Rank,
    Refusal,
    Request,
    RpcServerError,
    Verdict,
    choose_gguf_candidate,
    files_to_download,
    format_size,
    gguf_candidates,
    gguf_facts,
    hookimpl,
    host_ram_available,
)
from anyformer_llamacpp import BACKEND_ID
from anyformer_llamacpp.content_tokens import special_in_content
from anyformer_llamacpp.estimate import BATCH, Footprint, context_for, footprint, measured_speed
from anyformer_llamacpp.file_choice import choose_gguf, llamacpp_order, projector_for
from anyformer_llamacpp.parallel_option import flash_attention, parallel_option, pick_threads, streams_for
from anyformer_llamacpp.runtime import (
    INSTALL_HINT,
    gpu_offload_library,
    llama_cpp_folder,
    llama_cpp_version,
    unsupported_version_reason,
    unused_gpu_note,
)

if TYPE_CHECKING:
    from anyformer_llamacpp.engine import LlamaCppModel

#: The tasks llama.cpp runs: chat, with images when the repo has a projector, and embeddings (its
#: embedding mode, pooled vectors from ``run``).
TASKS = ("text-generation", "image-text-to-text", "feature-extraction")


@hookimpl
def can_run(model: Model, caps: Caps, request: Request) -> Verdict:
    """Refuse with ``format``/``task``/``model``/``runtime``/``memory``, or estimate where the layers go."""
    if "gguf" not in model.formats:
        return Verdict.refuse(BACKEND_ID, Refusal.FORMAT, "no GGUF in the repo")
    task = request.task or model.task
    if task and task not in TASKS:
        return Verdict.refuse(BACKEND_ID, Refusal.TASK, f"task {task}; llama.cpp runs {', '.join(TASKS)}")
    order = llamacpp_order(model)
    if not order and request.options.get("file") is None:
        return Verdict.refuse(
            BACKEND_ID,
            Refusal.MODEL,
            "no language-model GGUF at a quant llama.cpp reads (projector files and incomplete split sets don't count)",
        )
    if llama_cpp_folder() is None:
        return Verdict.refuse(BACKEND_ID, Refusal.RUNTIME, f"llama_cpp is not installed: {INSTALL_HINT}")
    wrong_version = unsupported_version_reason(llama_cpp_version())
    if wrong_version is not None:
        return Verdict.refuse(BACKEND_ID, Refusal.RUNTIME, wrong_version)
    # The projector (mmproj) that reads image blocks is fetched and loaded with the model, except to embed.
    mmproj = projector_for(model) if task != "feature-extraction" else None

    def judge(choice: GGUFCandidate, facts: dict[str, Any] | None) -> Verdict:
        return _judge_file(model, caps, request, task, choice, facts or {}, mmproj)

    return choose_gguf_candidate(BACKEND_ID, model, request, order, judge)


def _judge_file(
    model: Model,
    caps: Caps,
    request: Request,
    task: str | None,
    choice: GGUFCandidate,
    facts: dict[str, Any],
    mmproj: ModelFile | None,
) -> Verdict:
    """The verdict on loading ``choice`` (its header summary ``facts``; empty: estimated from its size)."""
    mmproj_files = (mmproj.name,) if mmproj is not None else ()
    mmproj_bytes = (mmproj.size or 0) if mmproj is not None else 0
    store_problem = _store_problem(model, caps, [*choice.files, *([mmproj] if mmproj is not None else [])])
    if store_problem is not None:
        return Verdict.refuse(BACKEND_ID, Refusal.STORE, store_problem)
    gpu_library = gpu_offload_library()
    if request.rpc:
        files = choice.names + mmproj_files
        return _can_run_over_rpc(caps, request, facts, choice.size, files, mmproj_bytes, gpu_library)
    budget = request.budget_or(caps.gpu_bytes)

    def plan_for(streams: int) -> Footprint:
        context = context_for(facts, request.context) * streams
        return footprint(facts, choice.size, context=context, budget=budget, gpu_offload=gpu_library is not None)

    # With parallel=N every stream has a KV region of the whole context: as many of them as host memory
    # holds are counted, as load counts them (a bad value is load's to refuse, with BAD_REQUEST). Image
    # and embedding models are loaded one-stream.
    parallel = 1
    if mmproj is None and task != "feature-extraction":
        with contextlib.suppress(AnyformerError):
            parallel = streams_for(
                request.options,
                caps.ram_bytes,
                lambda n: plan_for(n).ram_bytes + mmproj_bytes,
                pick_threads(request.options),
            )
    plan = plan_for(parallel)
    # The projector sits in host memory beside the model: the check counts it as the estimate does.
    host_bytes = plan.ram_bytes + mmproj_bytes
    if host_bytes > caps.ram_bytes:
        where = f"{plan.gpu_layers} layers on the GPU and the rest" if plan.gpu_layers else "the model"
        projector = f", projector {format_size(mmproj_bytes)}" if mmproj_bytes else ""
        streams = f" ({parallel} streams)" if parallel > 1 else ""
        return Verdict.refuse(
            BACKEND_ID,
            Refusal.MEMORY,
            f"{choice.first.name}: {where} needs {format_size(host_bytes)} of host memory at {plan.context} tokens "
            f"of context{streams} (weights {format_size(plan.weights_bytes)}, KV cache {format_size(plan.kv_bytes)}"
            f"{projector}); {format_size(caps.ram_bytes)} available",
            need=host_bytes,
        )
    device = gpu_library if plan.full_offload else "cpu"
    speed = measured_speed(model.architecture or facts.get("architecture"), choice.size, device or "cpu")
    note = unused_gpu_note(caps, gpu_library)
    offload = gpu_library if gpu_library is not None and plan.gpu_layers else "cpu"
    layers = f"{plan.gpu_layers} of {plan.layers} layers" if plan.layers else f"{plan.gpu_layers} layers"
    return Verdict.accept(
        BACKEND_ID,
        Estimate(
            gpu_bytes=plan.gpu_bytes,
            ram_bytes=host_bytes,
            disk_bytes=choice.size + mmproj_bytes,
            tok_per_sec=speed,
            rank=Rank.FALLBACK,
            details={
                "file": choice.first.name,
                "quant": choice.quant,
                "shards": len(choice.files),
                "context": plan.context // parallel,
                "parallel": parallel,
                "gpu_layers": plan.gpu_layers,
                "layers": plan.layers,
                # What llama.cpp really runs the layers on, and what it was built for.
                "offload": offload,
                "build": gpu_library or "cpu",
                "placement": f"{layers} on {offload}" if offload != "cpu" else "on the CPU",
                "projector": mmproj.name if mmproj is not None else None,
                "estimated": not facts,
                **({"note": note} if note else {}),
            },
            files=choice.names + mmproj_files,
            # Without a projector the engine's own refusal of an image block says why (no mmproj in the repo).
            inputs=("image",) if mmproj is not None else None,
        ),
    )


def load_choice(model: Model, request: Request) -> GGUFCandidate | None:
    """The candidate a load reads: the one ``can_run`` chooses with the host memory free now, else the first."""
    caps = Caps(ram_bytes=host_ram_available(), store=True, gpu_bytes=request.budget)
    verdict = can_run(model, caps, request)
    if verdict.ok and verdict.estimate is not None:
        name = verdict.estimate.details.get("file")
        found = next((c for c in gguf_candidates(model) if c.name == name), None)
        if found is not None:
            return found
    named = request.options.get("file")
    if named is not None:
        return next((c for c in gguf_candidates(model) if named in c.names), None)
    return choose_gguf(model)


def _can_run_over_rpc(
    caps: Caps,
    request: Request,
    facts: dict[str, Any],
    weights_bytes: int,
    files: tuple[str, ...],
    projector_bytes: int,
    gpu_library: str | None,
) -> Verdict:
    """Ask the RPC servers what they lend (``runtime`` refusal naming one that does not answer in time or
    speaks another protocol) and plan the layers over them, the local GPU and the host."""
    from anyformer_llamacpp.rpc_devices import REBUILD_HINT, probe_servers, rpc_library
    from anyformer_llamacpp.rpc_split import devices_of, order_for_output, plan_split

    if rpc_library() is None:
        return Verdict.refuse(BACKEND_ID, Refusal.RUNTIME, f"llama-cpp-python was built without RPC; {REBUILD_HINT}")
    try:
        servers = order_for_output(probe_servers(request.rpc))
    except RpcServerError as exc:
        return Verdict.refuse(BACKEND_ID, Refusal.RUNTIME, str(exc))
    context = context_for(facts, request.context)
    local_gpu = request.budget_or(caps.gpu_bytes) if gpu_library is not None else 0
    plan = plan_split(facts, weights_bytes, context, min(BATCH, context), devices_of(servers, local_gpu))
    host_bytes = plan.host_bytes + projector_bytes
    if host_bytes > caps.ram_bytes:
        lent = format_size(sum(server.free_bytes for server in servers))
        return Verdict.refuse(
            BACKEND_ID,
            Refusal.MEMORY,
            f"{plan.layers - plan.offloaded} of {plan.layers} layers stay on this host and need "
            f"{format_size(host_bytes)} of memory; {format_size(caps.ram_bytes)} available (the RPC servers lend "
            f"{lent})",
            need=host_bytes,
        )
    return Verdict.accept(
        BACKEND_ID,
        Estimate(
            gpu_bytes=0,
            ram_bytes=host_bytes,
            disk_bytes=weights_bytes + projector_bytes,
            tok_per_sec=None,
            rank=Rank.FALLBACK,
            details={
                "file": files[0],
                "context": context,
                "gpu_layers": plan.n_gpu_layers,
                "layers": plan.layers,
                "offload": "rpc" + (f" + {gpu_library}" if local_gpu else ""),
                "rpc": plan.details(),
            },
            files=files,
        ),
    )


def _store_problem(model: Model, caps: Caps, files: list[ModelFile]) -> str | None:
    """Why the files a load needs cannot be downloaded into the store (a ``store`` refusal), or None.

    Only Hub files not yet in the cache are downloaded; local and cached files need no room.
    """
    missing = files_to_download(model, [f.name for f in files])
    if not missing:
        return None
    size = sum(f.size or 0 for f in missing)
    names = missing[0].name if len(missing) == 1 else f"{len(missing)} files"
    if not caps.store:
        where = f" ({caps.store_path})" if caps.store_path else ""
        return f"{names} ({format_size(size)}) must be downloaded and the model store{where} is not writable"
    if caps.disk_free_bytes is not None and size > caps.disk_free_bytes:
        return (
            f"{names} ({format_size(size)}) must be downloaded and the store's disk has "
            f"{format_size(caps.disk_free_bytes)} free"
        )
    return None


@hookimpl
def load(model: Model, request: Request, progress: ProgressCallback) -> LlamaCppModel:
    """Fetch and validate the chosen GGUF, then open it with llama.cpp (called only when llamacpp was chosen)."""
    from anyformer_llamacpp.engine import LlamaCppModel  # imports llama_cpp

    # parallel=N serves N streams batched in one context; image and embedding models serve one.
    asked = parallel_option(request.options)
    flash_attention(request.options)  # a bad value is refused before any file is fetched
    special_in_content(request.options)
    one_stream = (request.task or model.task) == "feature-extraction" or projector_for(model) is not None
    # The engine opens the file can_run chose: handed over, so that the engine never imports these hooks.
    choice = load_choice(model, request)
    if asked != 1 and not one_stream and choice is not None:
        parallel = _streams_that_fit_now(model, request, choice)
        if parallel > 1:
            from anyformer_llamacpp._parallel_model import ParallelLlamaCppModel

            return ParallelLlamaCppModel.open_parallel(model, request, progress, parallel, choice)
    return LlamaCppModel.open(model, request, progress, choice)


def _streams_that_fit_now(model: Model, request: Request, choice: GGUFCandidate) -> int:
    """How many of the streams the ``parallel`` option asks for the host memory available now holds (as
    ``can_run`` reckons it for ``choice``)."""
    facts = gguf_facts(model, choice) or {}
    gpu_offload = gpu_offload_library() is not None

    def host_bytes(streams: int) -> int:
        context = context_for(facts, request.context) * streams
        return footprint(
            facts, choice.size, context=context, budget=request.budget or 0, gpu_offload=gpu_offload
        ).ram_bytes

    return streams_for(request.options, host_ram_available(), host_bytes, pick_threads(request.options))
