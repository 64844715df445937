"""The public entry points that tie description, probe, plugins and policy together."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from anyformer._known_backends import install_hint
from anyformer._loaded import Loaded
from anyformer._plugins import PluginManager, get_plugin_manager
from anyformer._selection import Selection, raise_if_none, select
from anyformer._session import InProcessSession, Session
from anyformer.contract._caps import Caps
from anyformer.contract._endpoints import RPC_ENV
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._model import Model
from anyformer.contract._progress import ProgressCallback, no_progress
from anyformer.contract._request import Request
from anyformer.contract._verdict import Refusal, Verdict
from anyformer.machine._probe import probe

ModelRef = str | os.PathLike[str] | Mapping[str, Any] | Model


def _request_with_budget(request: Request, caps: Caps) -> Request:
    if request.budget is not None:
        return request
    return dataclasses.replace(request, budget=caps.gpu_bytes or 0)


def _rpc_or_env(rpc: str | Sequence[str] | None) -> str | Sequence[str] | None:
    """The RPC servers a call names, else those ``ANYFORMER_RPC`` names."""
    return os.environ.get(RPC_ENV) if rpc is None else rpc


def _only_rpc_capable(verdicts: list[Verdict], request: Request) -> list[Verdict]:
    """With RPC servers asked for, a backend that accepted without planning for them is turned into a refusal."""
    if not request.rpc:
        return verdicts
    return [
        verdict
        if not verdict.ok or (verdict.estimate is not None and "rpc" in verdict.estimate.details)
        else Verdict.refuse(
            verdict.backend,
            Refusal.RUNTIME,
            f"does not run models over llama.cpp RPC servers ({', '.join(request.rpc)} were asked for)",
        )
        for verdict in verdicts
    ]


def check_file_option(model: Model, options: Mapping[str, Any]) -> None:
    """``BAD_REQUEST`` listing the weight files when the ``file`` option names no weight file of ``model``."""
    wanted = options.get("file")
    if wanted is None:
        return
    weights = [f.name for f in model.files if f.format in ("gguf", "onnx", "safetensors")]
    if isinstance(wanted, str) and wanted in weights:
        return
    listed = ", ".join(weights[:40]) + (f" and {len(weights) - 40} more" if len(weights) > 40 else "")
    raise AnyformerError(
        ErrorCode.BAD_REQUEST,
        f"file={wanted!r:.120} is no weight file of {model.ref}; its weight files: {listed or 'none'}",
    )


def check(
    model: ModelRef,
    *,
    task: str | None = None,
    budget: int | str | None = None,
    caps: Caps | None = None,
    prefer: Sequence[str] | str | None = None,
    backend: str | None = None,
    context: int | None = None,
    plugins: PluginManager | None = None,
    rpc: str | Sequence[str] | None = None,
    options: dict[str, Any] | None = None,
) -> tuple[Model, Selection]:
    """Ask every installed backend (or only ``backend``) whether it can run ``model``; nothing is loaded.

    Returns the description and the :class:`Selection`: every verdict in policy order and the
    chosen one, or None when nothing can run it. A model whose only weights are pickle raises
    ``UNSAFE_FORMAT``, as :func:`load` does. ``rpc`` and ``options`` are as for :func:`load`: the
    backends size their estimates for those load options (``parallel=4``: four streams' KV cache).
    """
    asked = Request.build(
        task=task, budget=budget, prefer=prefer, context=context, options=options, rpc=_rpc_or_env(rpc)
    )
    judged = judge(model, asked, caps=caps, manager=plugins or get_plugin_manager(), backend=backend)
    return judged.model, judged.selection


@dataclasses.dataclass(frozen=True)
class Judgement:
    """What ``check`` answers and ``load`` acts on: the description, the request as the backends saw it
    (its budget filled in from the machine), and the selection over their verdicts."""

    model: Model
    request: Request
    verdicts: list[Verdict]
    selection: Selection


def judge(
    model: ModelRef,
    asked: Request,
    *,
    caps: Caps | None,
    manager: PluginManager,
    backend: str | None,
    described: Callable[[Model], None] | None = None,
) -> Judgement:
    """Describe ``model`` and ask the backends (or only ``backend``) for their verdicts, then select: the one
    path behind both :func:`check` and :func:`load`, so that what ``check`` says is what ``load`` does.

    ``described`` sees the description as soon as it exists (``load`` hands an isolated worker the headers
    read while describing, so that the worker takes them in while this process selects).
    """
    from anyformer._describe import describe

    if backend is not None:
        manager.require_backend(backend)
    description = describe(model)
    if described is not None:
        described(description)
    refuse_pickle_only(description)
    check_file_option(description, asked.options)
    machine = caps or probe()
    request = _request_with_budget(asked, machine)
    verdicts = _only_rpc_capable(manager.can_run(description, machine, request, only=backend), request)
    return Judgement(description, request, verdicts, select(verdicts, request.prefer))


def load(
    model: ModelRef,
    task: str | None = None,
    budget: int | str | None = None,
    backend: str | None = None,
    progress: ProgressCallback = no_progress,
    *,
    caps: Caps | None = None,
    prefer: Sequence[str] | str | None = None,
    context: int | None = None,
    options: dict[str, Any] | None = None,
    plugins: PluginManager | None = None,
    isolate: bool = False,
    rpc: str | Sequence[str] | None = None,
) -> Loaded:
    """Describe ``model``, choose a backend by the policy (or use ``backend``), and load it.

    Raises ``NO_BACKEND`` or ``BUDGET_TOO_SMALL`` with every verdict when nothing can run it;
    with ``backend=`` named, that backend's refusal is raised. A model whose only weights are
    pickle raises ``UNSAFE_FORMAT``: they are never loaded.

    ``isolate=True`` loads and runs the backend in a worker process: the same ``Loaded`` API,
    and an engine that aborts, segfaults or runs out of memory ends only the worker
    (``BACKEND_CRASHED``; ``OUT_OF_MEMORY`` when it dies of it while loading). Description and
    selection stay in this process; the worker imports only the chosen backend's entry point.

    ``rpc`` names llama.cpp RPC servers (``"host:port"``, a list or a comma-separated string;
    default: ``ANYFORMER_RPC``) whose memory the model may span (docs/rpc.md). Such a load always
    runs isolated: llama.cpp ends its process when a server goes away, and that must end only the
    worker (``BACKEND_CRASHED`` naming the server that no longer answers).
    """
    asked = Request.build(
        task=task, budget=budget, prefer=prefer, context=context, options=options, rpc=_rpc_or_env(rpc)
    )
    isolate = isolate or bool(asked.rpc)
    # The worker's interpreter starts and imports anyformer while this process describes and selects.
    worker = _start_worker() if isolate else None
    try:
        manager = plugins or get_plugin_manager()
        shared = (lambda _description: _share_headers(worker, _local_path(model))) if worker is not None else None
        judged = judge(model, asked, caps=caps, manager=manager, backend=backend, described=shared)
        description, request, verdicts = judged.model, judged.request, judged.verdicts
        if not verdicts and not manager.backends():
            why = manager.why_no_backend(install_hint(description.formats))
            raise AnyformerError(ErrorCode.NO_BACKEND, f"cannot run {description.ref}: {why}", verdicts=[])
        chosen = raise_if_none(judged.selection, description.ref, description.formats)
        others = tuple(v for v in verdicts if v.backend != chosen.backend)
        if chosen.code is Refusal.RUNTIME:  # pragma: no cover - select never chooses a refusal
            raise AnyformerError("PLUGIN_ERROR", chosen.reason)
    except BaseException:
        if worker is not None:
            _end_worker(worker)
        raise
    if worker is not None:
        session = _spawn_worker(manager, chosen.backend, description, request, progress, worker)
        return Loaded(session, description, chosen, others)
    handle = manager.load(chosen.backend, description, request, progress)
    return Loaded(InProcessSession(handle), description, chosen, others)


def refuse_pickle_only(model: Model) -> None:
    """Raise ``UNSAFE_FORMAT`` when pickle files are ``model``'s only weights (SAFETY P1)."""
    if model.formats != ("pickle",):
        return
    names = ", ".join(f.name for f in model.files_of("pickle")[:3])
    raise AnyformerError(
        ErrorCode.UNSAFE_FORMAT,
        f"{model.ref} holds only pickle weights ({names}): unpickling runs code from the file, so anyformer "
        "never loads them; use a safetensors, GGUF or ONNX version of the model",
    )


def _local_path(model: ModelRef) -> str | None:
    """``model`` as a path when it names a local file or folder (the worker may describe it ahead), else None."""
    if not isinstance(model, (str, os.PathLike)):
        return None
    path = os.path.abspath(os.path.expanduser(os.fspath(model)))
    return path if os.path.exists(path) else None


def _start_worker() -> Any:
    from anyformer.isolation._worker_start import take_prestarted  # subprocess only when isolating

    process = take_prestarted()  # the `anyformer` command started one as it began
    if process is not None:
        return process
    from anyformer.isolation._worker_session import start_worker_process

    return start_worker_process()


def _share_headers(process: Any, path: str | None) -> None:
    """Hand the worker the headers this process validated while describing the local model ``path``."""
    if path is not None:
        from anyformer.isolation._worker_start import share_headers

        share_headers(process, path)


def _end_worker(process: Any) -> None:
    from anyformer.isolation._worker_session import end_worker_process

    end_worker_process(process)


def _spawn_worker(
    manager: PluginManager,
    backend: str,
    model: Model,
    request: Request,
    progress: ProgressCallback,
    process: Any = None,
) -> Session:
    from anyformer.isolation._worker_session import WorkerSession  # subprocess and threads only when isolating

    entry_point = manager.entry_point(backend)
    if entry_point is None:
        if process is not None:
            _end_worker(process)
        raise AnyformerError(
            ErrorCode.BAD_REQUEST,
            f"backend {backend!r} was registered in this process, not installed through an entry point; "
            "an isolated worker loads backends from entry points only (load with isolate=False)",
        )
    return WorkerSession.spawn(backend, entry_point, model, request, progress, process)
