"""A plugin written for the hooks before the handle owned generation: what changed, in one line.

Until issue 29 a backend implemented a ``generate(loaded, messages, options)`` hook and its
``load`` took the backend's id (``load(backend, model, request, progress)``). Both are gone:
``load(model, request, progress)`` returns an :class:`anyformer.plugin.BackendModel` whose
``generate`` method the core calls. pluggy alone would report such a plugin as "unknown hook" or a
list of argument names; the host reports it with what to change instead (:func:`old_hook_problems`).
"""

from __future__ import annotations

import inspect
from typing import Any

from anyformer.hookspecs import PROJECT

#: The attribute pluggy's ``HookimplMarker(PROJECT)`` sets on each marked function.
_MARK = f"{PROJECT}_impl"
#: Where the new shape is written down.
_GUIDE = "see docs/plugin-author-guide.md"


def _marked(plugin: Any, name: str) -> Any | None:
    """The plugin's hook implementation called ``name``, or None when it has none marked as one."""
    try:
        function = getattr(plugin, name, None)
    except Exception:  # a plugin object whose attribute access raises is pluggy's to report
        return None
    return function if function is not None and hasattr(function, _MARK) else None


def _takes(function: Any, argument: str) -> bool:
    try:
        return argument in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


def old_hook_problems(plugin: Any) -> str | None:
    """One line saying which old hook shapes ``plugin`` still has and what to do, or None when it has none."""
    problems = []
    if _marked(plugin, "generate") is not None:
        problems.append(
            "the generate hook is gone: move its body into your handle's generate(messages, options) "
            "method, the handle subclassing anyformer.plugin.BackendModel"
        )
    load = _marked(plugin, "load")
    if load is not None and _takes(load, "backend"):
        problems.append(
            "load no longer takes backend (it is called only on this plugin): "
            "drop the argument and any `if backend != ...: return None` guard"
        )
    if not problems:
        return None
    return f"written for the old hooks: {'; '.join(problems)} ({_GUIDE})"
