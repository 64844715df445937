"""anyformer: run any Hugging Face model on the machine in front of you.

Every installed backend is asked whether it can run a model, the best one is chosen by a fixed
policy, and the answer streams through one contract. See ``docs/`` for the guides.
"""

from anyformer._api import check, load
from anyformer._backend import BackendModel
from anyformer._chat_template import render_chat
from anyformer._default_model import default_model_path
from anyformer._describe import describe
from anyformer._loaded import Loaded
from anyformer._plugins import PluginInfo, PluginManager, get_plugin_manager
from anyformer._selection import Selection, select
from anyformer.contract._caps import Caps, probe
from anyformer.contract._chunk import Chunk, FinishReason, GenerateOptions, TokenLogprob
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._messages import Message, has_images, text_of, validate_messages
from anyformer.contract._model import Model, ModelFile
from anyformer.contract._progress import ProgressCallback, ProgressEvent
from anyformer.contract._request import Request
from anyformer.contract._sizes import format_size, parse_size
from anyformer.contract._store_entry import StoreEntry
from anyformer.contract._verdict import Estimate, Rank, Refusal, Verdict
from anyformer.hookspecs import hookimpl
from anyformer.store._paths import anyformer_home
from anyformer.store._pull import PullResult, pull
from anyformer.store._store import fetch_files

__version__ = "0.1.0"

__all__ = [
    "AnyformerError",
    "BackendModel",
    "Caps",
    "Chunk",
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
    "Verdict",
    "__version__",
    "anyformer_home",
    "check",
    "default_model_path",
    "describe",
    "fetch_files",
    "format_size",
    "get_plugin_manager",
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
