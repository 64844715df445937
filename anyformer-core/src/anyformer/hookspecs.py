"""The four hooks a backend plugin implements (docs/contract.md, "Hooks"; docs/hooks.md).

A backend is a distribution with an entry point in the group ``anyformer``; the entry point's
name is the backend's id, and it points at a module (or object) holding ``@anyformer.hookimpl``
functions. Every hook is optional to implement except ``can_run``, ``load`` and ``generate`` for a
backend that runs models. Hook implementations may accept any subset of a hook's arguments.

The core calls each plugin's implementation directly, one plugin at a time, never through one
pluggy call across all plugins: a plugin that raises is reported by name and the others keep
working. So no hook is a pluggy "first result" hook: ``load`` is called only on the chosen
backend and ``generate`` only on the backend that owns the handle, and neither returns None.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from anyformer._backend import BackendModel
    from anyformer.contract._caps import Caps
    from anyformer.contract._chunk import Chunk, GenerateOptions
    from anyformer.contract._messages import Message
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
    :param request: the task asked for (None: the model's own), the accelerator budget, and
        ``options``: this backend's declared load options only (its module's ``LOAD_OPTIONS``),
        parsed by the core to their types, defaults filled in. The core checks the store for the
        files an accepting estimate names (``Estimate.files``): do not.
    :returns: this backend's :class:`anyformer.Verdict`: ``Verdict.accept(id, Estimate(...))`` or
        ``Verdict.refuse(id, Refusal.X, "one line with the numbers", need=...)``. ``need`` is
        required on ``budget`` and ``memory`` refusals, and must be larger than what was offered.
        Return None only when the plugin runs no models (a plugin that only lists a store).

    Called on every plugin, each on its own; one that raises becomes a ``runtime`` refusal naming
    the exception. Keep it fast: it runs on every ``anyformer check``.
    """


# ---- loading and running ------------------------------------------------------------------------


@hookspec
def load(backend: str, model: Model, request: Request, progress: ProgressCallback) -> BackendModel:
    """Load ``model`` for ``request``; called only on the backend the selection chose (``backend`` is its id).

    :param backend: this plugin's id (the entry point's name), the one the selection policy chose.
    :param model: the description; local files have ``path``; ``anyformer.plugin.fetch_files(model,
        names, progress)`` returns local paths for the files you need, downloading Hub files into
        the shared cache with progress.
    :param request: the task, budget and context length the model is loaded for, and its load
        options parsed by the core (as for ``can_run``).
    :param progress: call it with :class:`anyformer.ProgressEvent` during long steps.
    :returns: a handle with ``backend`` (this id), ``task``, ``dispose()`` (and ``run()`` for
        non-generation tasks; ``run_progress = True`` when ``run`` takes the core's ``progress``
        callable, reports each unit of work to it and lets the ``CANCELLED`` it raises propagate).
        Raise ``AnyformerError`` (``BAD_MODEL``, ``OUT_OF_MEMORY``, ``BUDGET_TOO_SMALL``…) for
        failures a person can act on. Returning anything else
        (None included) is a ``PLUGIN_ERROR``.
    """


@hookspec
def generate(loaded: BackendModel, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
    """Start generating a reply; called only on the backend whose ``load`` returned ``loaded``.

    :param loaded: a handle this plugin's ``load`` returned.
    :param messages: validated chat messages (the core rejects malformed ones before this call);
        empty for a raw completion.
    :param options: validated options: ``max_new_tokens``, ``temperature`` (0 is greedy and
        repeatable), ``seed``, ``thinking``, ``stop`` and ``cancel`` (a ``threading.Event``).
        ``options.prompt`` is the raw text to continue with no chat template; the core sends one
        only to a handle that sets ``raw_text = True``; ``options.prompt_logprobs`` (score the prompt's
        own tokens on the first chunk; ``max_new_tokens`` may then be 0) only to one that also sets
        ``prompt_logprobs = True``.
    :returns: an iterable of :class:`anyformer.Chunk` whose ``delta`` is the new text and
        ``tokens`` the count generated so far (never decreasing, at most ``max_new_tokens``); the
        last may carry ``finish_reason`` (the core supplies one when it does not). Check
        ``options.cancel`` between tokens and put the model back in a usable state in a
        ``finally`` block: the core closes the iterator on cancel. The core holds a lock per
        loaded model, so calls never overlap. Returning None is a ``PLUGIN_ERROR``.
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
