"""anyformer: run any Hugging Face model on the machine in front of you.

Every installed backend is asked whether it can run a model, the best one is chosen by a fixed
policy, and the answer streams through one contract. See ``docs/`` for the guides.

The names below are imported on first use (PEP 562), so ``import anyformer.cli._main`` or an
isolated worker pays only for the modules it touches, and the ``anyformer`` command can start its
worker process before the rest of the package is imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from anyformer._api import check, load
    from anyformer._backend import BackendModel
    from anyformer._chat_template import render_chat
    from anyformer._default_model import default_model_path
    from anyformer._describe import describe
    from anyformer._loaded import Loaded
    from anyformer._plugins import PluginInfo, PluginManager, get_plugin_manager
    from anyformer._pull import PullResult, pull
    from anyformer._selection import Selection, select
    from anyformer.contract._caps import Caps
    from anyformer.contract._chunk import Chunk, FinishReason, GenerateOptions, TokenLogprob
    from anyformer.contract._constraint import Constraint
    from anyformer.contract._errors import AnyformerError, ErrorCode
    from anyformer.contract._messages import Message, has_audio, has_images, text_of, validate_messages
    from anyformer.contract._model import Model, ModelFile
    from anyformer.contract._progress import ProgressCallback, ProgressEvent
    from anyformer.contract._request import Request
    from anyformer.contract._sizes import format_size, parse_size
    from anyformer.contract._store_entry import StoreEntry
    from anyformer.contract._tool_calls import ToolCall
    from anyformer.contract._verdict import Estimate, Rank, Refusal, Verdict
    from anyformer.hookspecs import hookimpl
    from anyformer.machine._probe import probe
    from anyformer.store._paths import anyformer_home
    from anyformer.store._store import fetch_files

__version__ = "0.1.0"

#: Where each public name lives: imported from there the first time it is asked for.
_EXPORTS = {
    "check": "anyformer._api",
    "load": "anyformer._api",
    "BackendModel": "anyformer._backend",
    "render_chat": "anyformer._chat_template",
    "default_model_path": "anyformer._default_model",
    "describe": "anyformer._describe",
    "Loaded": "anyformer._loaded",
    "PluginInfo": "anyformer._plugins",
    "PluginManager": "anyformer._plugins",
    "get_plugin_manager": "anyformer._plugins",
    "Selection": "anyformer._selection",
    "select": "anyformer._selection",
    "Caps": "anyformer.contract._caps",
    "probe": "anyformer.machine._probe",
    "Chunk": "anyformer.contract._chunk",
    "FinishReason": "anyformer.contract._chunk",
    "GenerateOptions": "anyformer.contract._chunk",
    "TokenLogprob": "anyformer.contract._chunk",
    "Constraint": "anyformer.contract._constraint",
    "ToolCall": "anyformer.contract._tool_calls",
    "AnyformerError": "anyformer.contract._errors",
    "ErrorCode": "anyformer.contract._errors",
    "Message": "anyformer.contract._messages",
    "has_audio": "anyformer.contract._messages",
    "has_images": "anyformer.contract._messages",
    "text_of": "anyformer.contract._messages",
    "validate_messages": "anyformer.contract._messages",
    "Model": "anyformer.contract._model",
    "ModelFile": "anyformer.contract._model",
    "ProgressCallback": "anyformer.contract._progress",
    "ProgressEvent": "anyformer.contract._progress",
    "Request": "anyformer.contract._request",
    "format_size": "anyformer.contract._sizes",
    "parse_size": "anyformer.contract._sizes",
    "StoreEntry": "anyformer.contract._store_entry",
    "Estimate": "anyformer.contract._verdict",
    "Rank": "anyformer.contract._verdict",
    "Refusal": "anyformer.contract._verdict",
    "Verdict": "anyformer.contract._verdict",
    "hookimpl": "anyformer.hookspecs",
    "anyformer_home": "anyformer.store._paths",
    "PullResult": "anyformer._pull",
    "pull": "anyformer._pull",
    "fetch_files": "anyformer.store._store",
}

__all__ = [
    "AnyformerError",
    "BackendModel",
    "Caps",
    "Chunk",
    "Constraint",
    "ErrorCode",
    "Estimate",
    "FinishReason",
    "GenerateOptions",
    "Loaded",
    "Message",
    "Model",
    "ModelFile",
    "PluginInfo",
    "PluginManager",
    "ProgressCallback",
    "ProgressEvent",
    "PullResult",
    "Rank",
    "Refusal",
    "Request",
    "Selection",
    "StoreEntry",
    "TokenLogprob",
    "ToolCall",
    "Verdict",
    "__version__",
    "anyformer_home",
    "check",
    "default_model_path",
    "describe",
    "fetch_files",
    "format_size",
    "get_plugin_manager",
    "has_audio",
    "has_images",
    "hookimpl",
    "load",
    "parse_size",
    "probe",
    "pull",
    "render_chat",
    "select",
    "text_of",
    "validate_messages",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use, and keep the name here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'anyformer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
