"""Everything a backend plugin needs, in one public module.

A backend's code imports from the core this module and nothing else (``tests/test_import_graph.py``):
private core modules move between releases, this module does not. ``docs/plugin-author-guide.md``
walks through each name; ``docs/contract.md`` is the contract they implement.

Groups, in the order a backend meets them:

- hooks: :data:`hookimpl`, and the hook specifications in :mod:`anyformer.hookspecs` (``can_run``,
  ``load``, ``store_list``);
- the contract's types: :class:`Model`, :class:`ModelFile`, :class:`Caps`, :class:`Request`,
  :class:`Verdict`, :class:`Estimate`, :class:`Rank`, :class:`Refusal`, :class:`Chunk`, :class:`TokenLogprob`,
  :class:`Constraint` (structured output), ``PENALTY_WINDOW`` (the tokens the penalties look at),
  :class:`GenerateOptions`, :class:`FinishReason`, :class:`StoreEntry`, :class:`ProgressEvent`,
  :data:`ProgressCallback`, :func:`no_progress`, :class:`AnyformerError`, :class:`ErrorCode`;
- the handle ``load`` returns: :class:`BackendModel` (subclass it: it owns ``generate``, ``run`` and
  ``dispose``) and :class:`Features` (what it can do beyond plain chat, one frozen record);
- load options, declared as a module's ``LOAD_OPTIONS`` and parsed by the core before any hook
  sees them: :class:`LoadOptions`, :class:`LoadOption`, :data:`FILE_OPTION` (the core's ``file``),
  :data:`NO_LOAD_OPTIONS`, and :func:`parse_yes_no` (the one reading of yes and no);
- messages and chat: :data:`Message`, :func:`validate_messages`, :func:`has_images`, :func:`has_audio`,
  :func:`text_of`, :func:`render_chat` (jinja2's sandbox), :data:`CHATML_TEMPLATE`,
  :class:`IncrementalDetokenizer` (streamed text equal to the whole decode),
  :func:`template_takes_tools`, :func:`with_tool_prompt` (tools for a template that cannot render them),
  :func:`tool_inputs` (the messages and variables that give a template's family its tools),
  :func:`chat_constraint` (the constraint a chat decodes under: a forced call in the family's syntax),
  :func:`tool_family`, :data:`TOOL_MARKUP` (tool-call markup an engine keeps in its text even where a
  tokenizer holds it as a special token), :class:`ToolCall`;
- structured output in a backend's sampler: :class:`ConstraintVocabulary` (a model's vocabulary as
  llguidance reads it) and :class:`TokenMask` (one stream's allowed tokens, applied to the logits);
- files, read with hard limits before any engine sees them: :func:`read_gguf_header`,
  :func:`check_split_set`, :func:`split_set_members`, :class:`GGUFHeader`, :class:`GGUFTensor`,
  :class:`LazyArray` (a long GGUF array in ``GGUFHeader.kv``, decoded on first use),
  :data:`GGML_TYPES`, :func:`read_safetensors_header`, :class:`SafetensorsHeader`,
  :func:`read_onnx_summary`, :func:`check_onnx_external_data`, :class:`OnnxSummary`,
  :func:`read_config_json`;
- a repo's GGUFs, for a backend that chooses one: :func:`gguf_candidates` (language models; a split
  set is one :class:`GGUFCandidate`), :func:`gguf_quant`, :func:`is_gguf_projector`,
  :data:`KNOWN_GGUF_QUANTS`, :func:`order_gguf_candidates` (a backend's preference),
  :func:`gguf_facts` (a candidate's header summary on demand, bounded and cached per commit) and
  :func:`choose_gguf_candidate` (judge candidates in order until one fits);
- images and audio a request hands over, with the bounds every backend applies:
  :func:`read_media_file`, :func:`check_image_size`, :func:`rgb_pixels`, :data:`MAX_IMAGE_PIXELS`,
  :data:`MAX_IMAGE_SIDE`, :data:`MAX_MEDIA_FILE_BYTES`, :func:`load_image` / :func:`load_images`
  (a ``run`` input as checked RGB Pillow images), :func:`decode_audio` (an audio file as mono
  samples at a rate, through PyAV);
- the store: :func:`fetch_files` (verified downloads into the Hub cache), :func:`files_to_download`
  (what a load would download, for a ``store`` refusal), :func:`anyformer_home`
  (where derived files go);
- the machine: :func:`probe` (its :class:`Caps`), :func:`usable_cpu_count`, :func:`host_ram_available`,
  :func:`adapter_fingerprint` (a key that changes with the GPU adapter's driver, wgpu or environment: for
  figures a backend times once);
- sizes: :func:`format_size`, :func:`parse_size`;
- llama.cpp RPC servers (``Request.rpc``): :func:`probe_rpc_server` (version and memory, with a
  timeout, before an engine connects), :class:`RpcServerInfo`, :class:`RpcDeviceMemory`,
  :class:`RpcServerError`.
"""

from anyformer._audio_decode import decode_audio
from anyformer._backend import BackendModel
from anyformer._chat_template import CHATML_TEMPLATE, render_chat, template_takes_tools
from anyformer._detokenizer import IncrementalDetokenizer
from anyformer._token_mask import ConstraintVocabulary, TokenMask
from anyformer._tool_families import chat_constraint, tool_family, tool_inputs
from anyformer.contract._caps import Caps
from anyformer.contract._chunk import Chunk, FinishReason, GenerateOptions, TokenLogprob
from anyformer.contract._constraint import Constraint
from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._features import Features
from anyformer.contract._load_options import FILE_OPTION, NO_LOAD_OPTIONS, LoadOption, LoadOptions, parse_yes_no
from anyformer.contract._messages import Message, has_audio, has_images, text_of, validate_messages
from anyformer.contract._model import Model, ModelFile
from anyformer.contract._progress import ProgressCallback, ProgressEvent, no_progress
from anyformer.contract._request import Request
from anyformer.contract._sampling import PENALTY_WINDOW
from anyformer.contract._sizes import format_size, parse_size
from anyformer.contract._store_entry import StoreEntry
from anyformer.contract._tool_calls import ToolCall, with_tool_prompt
from anyformer.contract._tool_syntaxes import TOOL_MARKUP
from anyformer.contract._verdict import Estimate, Rank, Refusal, Verdict
from anyformer.files._config_file import read_config_json
from anyformer.files._gguf_candidates import (
    KNOWN_GGUF_QUANTS,
    GGUFCandidate,
    gguf_candidates,
    gguf_quant,
    order_gguf_candidates,
)
from anyformer.files._gguf_candidates import is_projector as is_gguf_projector
from anyformer.files._gguf_header import (
    GGML_TYPES,
    GGUFHeader,
    GGUFTensor,
    LazyArray,
    check_split_set,
    read_gguf_header,
    split_set_members,
)
from anyformer.files._image_input import load_image, load_images
from anyformer.files._media_input import (
    MAX_IMAGE_PIXELS,
    MAX_IMAGE_SIDE,
    MAX_MEDIA_FILE_BYTES,
    check_image_size,
    read_media_file,
    rgb_pixels,
)
from anyformer.files._onnx_external import OnnxSummary, check_onnx_external_data, read_onnx_summary
from anyformer.files._safetensors_header import SafetensorsHeader, read_safetensors_header
from anyformer.hookspecs import hookimpl
from anyformer.machine._adapter_cache import fingerprint as adapter_fingerprint
from anyformer.machine._probe import host_ram_available, probe, usable_cpu_count
from anyformer.rpc._protocol import DeviceMemory as RpcDeviceMemory
from anyformer.rpc._protocol import RpcServerError, RpcServerInfo
from anyformer.rpc._protocol import probe as probe_rpc_server
from anyformer.store._gguf_choice import choose_gguf_candidate
from anyformer.store._gguf_facts import gguf_facts
from anyformer.store._paths import anyformer_home
from anyformer.store._store import fetch_files, files_to_download

__all__ = [
    "CHATML_TEMPLATE",
    "FILE_OPTION",
    "GGML_TYPES",
    "KNOWN_GGUF_QUANTS",
    "MAX_IMAGE_PIXELS",
    "MAX_IMAGE_SIDE",
    "MAX_MEDIA_FILE_BYTES",
    "NO_LOAD_OPTIONS",
    "PENALTY_WINDOW",
    "TOOL_MARKUP",
    "AnyformerError",
    "BackendModel",
    "Caps",
    "Chunk",
    "Constraint",
    "ConstraintVocabulary",
    "ErrorCode",
    "Estimate",
    "Features",
    "FinishReason",
    "GGUFCandidate",
    "GGUFHeader",
    "GGUFTensor",
    "GenerateOptions",
    "IncrementalDetokenizer",
    "LazyArray",
    "LoadOption",
    "LoadOptions",
    "Message",
    "Model",
    "ModelFile",
    "OnnxSummary",
    "ProgressCallback",
    "ProgressEvent",
    "Rank",
    "Refusal",
    "Request",
    "RpcDeviceMemory",
    "RpcServerError",
    "RpcServerInfo",
    "SafetensorsHeader",
    "StoreEntry",
    "TokenLogprob",
    "TokenMask",
    "ToolCall",
    "Verdict",
    "adapter_fingerprint",
    "anyformer_home",
    "chat_constraint",
    "check_image_size",
    "check_onnx_external_data",
    "check_split_set",
    "choose_gguf_candidate",
    "decode_audio",
    "fetch_files",
    "files_to_download",
    "format_size",
    "gguf_candidates",
    "gguf_facts",
    "gguf_quant",
    "has_audio",
    "has_images",
    "hookimpl",
    "host_ram_available",
    "is_gguf_projector",
    "load_image",
    "load_images",
    "no_progress",
    "order_gguf_candidates",
    "parse_size",
    "parse_yes_no",
    "probe",
    "probe_rpc_server",
    "read_config_json",
    "read_gguf_header",
    "read_media_file",
    "read_onnx_summary",
    "read_safetensors_header",
    "render_chat",
    "rgb_pixels",
    "split_set_members",
    "template_takes_tools",
    "text_of",
    "tool_family",
    "tool_inputs",
    "usable_cpu_count",
    "validate_messages",
    "with_tool_prompt",
]
