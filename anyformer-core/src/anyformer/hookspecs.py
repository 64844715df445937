"""The three hooks a backend plugin implements (docs/contract.md, "Hooks"; docs/hooks.md).

A backend is a distribution with an entry point in the group ``anyformer``; the entry point's
name is the backend's id, and it points at a module (or object) holding ``@anyformer.hookimpl``
functions. Every hook is optional to implement except ``can_run`` and ``load`` for a backend that
runs models. Hook implementations may accept any subset of a hook's arguments. Generation is not a
hook: ``load`` returns a :class:`anyformer.plugin.BackendModel` and the core calls its methods.

The core calls each plugin's implementation directly, one plugin at a time, never through one
pluggy call across all plugins: a plugin that raises is reported by name and the others keep
working. So no hook is a pluggy "first result" hook, and none takes the backend's id: ``load`` is
called only on the chosen backend and never returns None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from anyformer._backend import BackendModel
    from anyformer.contract._caps import Caps
    from anyformer.contract._model import Model
    from anyformer.contract._progress import ProgressCallback
    from anyformer.contract._request import Request
    from anyformer.contract._store_entry import StoreEntry
    from anyformer.contract._verdict import Verdict

#: The pluggy project name and the entry-point group.
PROJECT = "anyformer"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# ---- choosing a backend -------------------------------------------------------------------------


@hookspec
def can_run(model: Model, caps: Caps, request: Request) -> Verdict | None:
    """Say whether this backend can run ``model`` on a machine with ``caps`` for ``request``.

    :param model: the description: repo, architecture, task, tags and files with sizes. Its files
        may not exist locally: read no weights and open no network connection here.
    :param caps: the machine's capabilities (possibly overridden for a what-if question).
    :param request: the task asked for (None: the model's own) and the accelerator budget.
    :returns: this backend's :class:`anyformer.Verdict`: ``Verdict.accept(id, Estimate(...))`` or
        ``Verdict.refuse(id, Refusal.X, "one line with the numbers", need=...)``. ``need`` is
        required on ``budget`` and ``memory`` refusals, and must be larger than what was offered.
        Return None only when the plugin runs no models (a plugin that only lists a store).

    Called on every plugin, each on its own; one that raises becomes a ``runtime`` refusal naming
    the exception. Keep it fast: it runs on every ``anyformer check``.
    """


# ---- loading and running ------------------------------------------------------------------------


@hookspec
def load(model: Model, request: Request, progress: ProgressCallback) -> BackendModel:
    """Load ``model`` for ``request``; called only on the backend the selection chose (or the one named).

    :param model: the description; local files have ``path``; ``anyformer.plugin.fetch_files(model,
        names, progress)`` returns local paths for the files you need, downloading Hub files into
        the shared cache with progress.
    :param request: the task, budget and context length the model is loaded for.
    :param progress: call it with :class:`anyformer.ProgressEvent` during long steps.
    :returns: the handle, an instance of a subclass of :class:`anyformer.plugin.BackendModel` with
        ``backend`` (this plugin's id), ``task`` and ``features`` (a :class:`anyformer.plugin.Features`
        record). The handle owns the work from here: the core calls its ``generate`` (chat),
        ``run`` (other tasks) and ``dispose``, never another hook. Raise ``AnyformerError``
        (``BAD_MODEL``, ``OUT_OF_MEMORY``, ``BUDGET_TOO_SMALL``…) for failures a person can act on.
        Returning anything else (None included) is a ``PLUGIN_ERROR``.
    """


# ---- the store ----------------------------------------------------------------------------------


@hookspec
def store_list() -> Sequence[StoreEntry] | None:
    """List the models this plugin holds on disk outside the Hugging Face cache.

    :returns: :class:`anyformer.StoreEntry` items (``backend``, ``repo``, ``revision``, ``path``,
        ``bytes``) for backend-derived files under ``ANYFORMER_HOME``; ``[]`` when it keeps none
        (None is read as ``[]``). Hub cache entries are listed by the core itself.

    Called on every plugin, each on its own.
    """
