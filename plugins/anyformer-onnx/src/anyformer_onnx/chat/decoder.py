"""The decode loop of a decoder-only ONNX graph on onnxruntime, with its past key values kept in place.

The graph takes ``input_ids`` (or ``inputs_embeds``, the decoder of a multimodal export, whose
embeddings come from its ``embed_tokens`` graph and its vision encoder), ``attention_mask``,
``position_ids`` (when it has them) and
``past_key_values.N.key/value``, and returns ``logits`` and ``present.N.key/value``: the names
optimum's and transformers.js's exporters use. Each step feeds the previous step's ``present``
OrtValues as the next step's ``past`` (on the CPU in one ``run_with_ort_values`` call, on CUDA
through IO binding), so the cache never round-trips through numpy (on CUDA it never leaves the
GPU); only the last row of logits is copied out. The graph
itself still concatenates each new position onto the past (that is how these exports are built).

A decoder with per-layer inputs (Gemma 3n, Gemma 4's small models; :mod:`chat.per_layer`) also takes
``per_layer_inputs``, which ``embed_tokens`` returns beside ``inputs_embeds``: each step feeds both
outputs for its own tokens.

A hybrid decoder (Qwen3.5, Qwen3-Next; :mod:`chat.cache_state`) also carries its linear-attention
layers' ``past_conv.i`` / ``past_recurrent.i`` states: zeros at first, then each step's
``present_conv.i`` / ``present_recurrent.i``, fed back like the KV cache.

A Qwen2-VL-family decoder takes ``position_ids`` of shape [3, batch, seq] (M-RoPE, :mod:`chat.mrope`):
the prompt's rows come with the prompt when it holds images, and every later token's plain
position plus the prompt's rope delta fills all three rows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator, Mapping
from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_onnx.chat.cache_state import state_entries
from anyformer_onnx.chat.mrope import step_positions
from anyformer_onnx.chat.per_layer import FAMILY, PER_LAYER_INPUTS
from anyformer_onnx.chat.sampling import Sampler, apply_repetition_penalty

_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
#: Cache states beside the KV cache, as transformers.js names them (``past_conv.N``, ``past_recurrent.N``,
#: ``past_ssm.N``): linear-attention and state-space layers; refused by name.
_STATE = re.compile(r"^past_(conv|recurrent|ssm)\.")  # those cache_state does not carry reach the refusal
_ELEMENT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(bfloat16)": np.float32}
#: Inputs that say how many positions of logits to return; fed 1 (only the last is needed).
_LOGITS_TO_KEEP = ("num_logits_to_keep", "logits_to_keep")


def _dim(value: Any) -> int | None:
    return value if isinstance(value, int) and value > 0 else None


def _kv_shape(shape: list[Any], layer: int, config: Mapping[str, Any], label: str) -> tuple[int, int]:
    """Layer ``layer``'s past entry's (heads, head size): the graph's static dims, else config.json's.

    From config.json, a full-attention layer of a model with a ``global_head_dim`` (Gemma 4) has
    that head size, the others ``head_dim``.
    """
    heads = _dim(shape[1]) if len(shape) == 4 else None
    head_dim = _dim(shape[3]) if len(shape) == 4 else None
    heads = heads or _dim(config.get("num_key_value_heads")) or _dim(config.get("num_attention_heads"))
    hidden, all_heads = _dim(config.get("hidden_size")), _dim(config.get("num_attention_heads"))
    types = config.get("layer_types")
    if not head_dim and isinstance(types, list) and layer < len(types) and types[layer] == "full_attention":
        head_dim = _dim(config.get("global_head_dim"))
    head_dim = head_dim or _dim(config.get("head_dim")) or (hidden // all_heads if hidden and all_heads else None)
    if not (heads and head_dim):
        raise AnyformerError(
            ErrorCode.BAD_MODEL,
            f"{label}: the cache's head count and size are neither in the graph nor config.json",
        )
    return heads, head_dim


class DecoderGraph:
    """What the loop needs to know about one decoder session: input names and the cache's shape."""

    def __init__(self, session: Any, config: Mapping[str, Any], label: str) -> None:
        self.session = session
        self.label = label
        inputs = {i.name: i for i in session.get_inputs()}
        outputs = [o.name for o in session.get_outputs()]
        #: The graph reads embeddings rather than token ids (a multimodal export's decoder).
        self.takes_embeds = "inputs_embeds" in inputs and "input_ids" not in inputs
        if not ("input_ids" in inputs or self.takes_embeds) or "logits" not in outputs:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: not a decoder graph (no input_ids → logits)")
        past = sorted(
            (m for m in (_PAST.match(name) for name in inputs) if m), key=lambda m: (int(m.group(1)), m.group(2))
        )
        self.past_names = [m.group(0) for m in past]
        self.present_names = [f"present.{m.group(1)}.{m.group(2)}" for m in past]
        missing = [name for name in self.present_names if name not in outputs]
        if missing:
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"{label}: has {missing[0].replace('present', 'past_key_values')}"
            )
        self.has_mask = "attention_mask" in inputs
        self.has_positions = "position_ids" in inputs
        #: position_ids [3, batch, seq]: M-RoPE's temporal, height and width rows (Qwen2-VL family).
        self.mrope = self.has_positions and len(inputs["position_ids"].shape) == 3
        self.logits_to_keep = next((name for name in _LOGITS_TO_KEEP if name in inputs), None)
        self.has_cache_branch = "use_cache_branch" in inputs
        #: The graph reads ``per_layer_inputs`` beside the embeddings (Gemma 3n, Gemma 4's small models).
        self.per_layer = PER_LAYER_INPUTS in inputs
        if self.per_layer and not self.takes_embeds:
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"{label}: {FAMILY} that reads input_ids: no embed_tokens graph to feed it"
            )
        known = {
            "input_ids",
            "inputs_embeds",
            "attention_mask",
            "position_ids",
            "use_cache_branch",
            PER_LAYER_INPUTS,
            *_LOGITS_TO_KEEP,
        }
        #: Fixed-size states of linear-attention layers (Qwen3.5, Qwen3-Next; :mod:`chat.cache_state`).
        self.states = state_entries(inputs, outputs, config, label)
        #: Everything each step feeds back, and the outputs it comes from: the KV cache, then the states.
        self.carried = [*self.past_names, *(entry.name for entry in self.states)]
        self.returned = [*self.present_names, *(entry.present for entry in self.states)]
        unknown = [name for name in inputs if name not in known and name not in self.carried]
        if unknown:
            state = _STATE.match(unknown[0])
            what = (
                f"a cache state this loop does not carry ({unknown[0]}: only Qwen3.5 / Qwen3-Next's "
                "past_conv.N and past_recurrent.N are; LFM2's, the Mamba hybrids' and others' are not)"
                if state
                else f"an input this loop does not feed: {unknown[0]}"
            )
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: the graph wants {what}")
        self.kv_dtype: Any = np.float32
        #: Each past entry's (heads, head size): read per entry, since layers may differ (Gemma 4's
        #: full-attention layers have a wider head than its sliding ones).
        self.kv_shapes: dict[str, tuple[int, int]] = {}
        if self.past_names:
            first = inputs[self.past_names[0]]
            self.kv_dtype = _ELEMENT_TYPES.get(first.type)
            if self.kv_dtype is None:
                raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: past key values of type {first.type}")
            self.kv_shapes = {
                m.group(0): _kv_shape(list(inputs[m.group(0)].shape), int(m.group(1)), config, label) for m in past
            }
        #: The first entry's (heads, head size); (0, 0) without a cache.
        self.kv_shape: tuple[int, int] = self.kv_shapes[self.past_names[0]] if self.past_names else (0, 0)


class DecodeLoop:
    """Runs one generation: the prompt in one step, then one token per step, the cache bound in place."""

    def __init__(
        self,
        graph: DecoderGraph,
        device: str,
        embed: Callable[[list[int]], Mapping[str, np.ndarray]] | None = None,
    ):
        import onnxruntime

        self._ort = onnxruntime
        self.graph = graph
        self.device = device  # "cpu" or "cuda"
        #: Token ids to the embed_tokens graph's outputs by name: ``inputs_embeds`` [1, n, hidden] and,
        #: where it has them, ``per_layer_inputs`` [1, n, layers, width]; for a graph reading embeddings.
        self.embed = embed
        if graph.takes_embeds and embed is None:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{graph.label}: reads inputs_embeds and no embed_tokens graph")

    def _value(self, array: np.ndarray) -> Any:
        return self._ort.OrtValue.ortvalue_from_numpy(array, self.device, 0)

    def empty_cache(self) -> dict[str, Any]:
        """The cache before the first step: every past key and value with zero positions, every state zeros."""
        dtype = self.graph.kv_dtype
        cache = {
            name: self._value(np.zeros((1, heads, 0, head_dim), dtype=dtype))
            for name, (heads, head_dim) in self.graph.kv_shapes.items()
        }
        cache.update((entry.name, self._value(entry.initial())) for entry in self.graph.states)
        return cache

    def step(
        self,
        ids: list[int],
        total: int,
        cache: dict[str, Any],
        embeds: np.ndarray | None = None,
        positions: np.ndarray | None = None,
        delta: int = 0,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Run the graph on ``ids`` (the last of ``total`` positions); return the last logits and the new cache.

        ``cache`` is :meth:`empty_cache` for the first step, then the cache the step before returned.

        ``embeds`` [1, len(ids), hidden], when given, are fed for a graph that reads embeddings
        (a prompt whose image positions hold the vision encoder's features).

        For an M-RoPE graph, ``positions`` [3, len(ids)] are the step's rows when given (a prompt
        with images); otherwise each row is the plain positions plus ``delta``, the prompt's rope delta.
        """
        graph = self.graph
        feeds: dict[str, np.ndarray] = {}
        if graph.takes_embeds:
            assert self.embed is not None
            # The prompt's own embeddings (media spliced in) replace inputs_embeds only; per-layer
            # inputs always come from the tokens (a media position reads the table's row 0).
            embedded = self.embed(ids) if embeds is None or graph.per_layer else {}
            feeds["inputs_embeds"] = embedded["inputs_embeds"] if embeds is None else embeds
            if graph.per_layer:
                if PER_LAYER_INPUTS not in embedded:
                    what = f"{graph.label}: the decoder reads {PER_LAYER_INPUTS}; embed_tokens returns none"
                    raise AnyformerError(ErrorCode.BAD_MODEL, what)
                feeds[PER_LAYER_INPUTS] = embedded[PER_LAYER_INPUTS]
        else:
            feeds["input_ids"] = np.asarray([ids], dtype=np.int64)
        if graph.has_mask:
            feeds["attention_mask"] = np.ones((1, total), dtype=np.int64)
        if graph.mrope:
            first = total - len(ids)
            given = None if positions is None else np.ascontiguousarray(positions, dtype=np.int64)[:, None, :]
            feeds["position_ids"] = step_positions(first, len(ids), delta) if given is None else given
        elif graph.has_positions:
            feeds["position_ids"] = np.arange(total - len(ids), total, dtype=np.int64)[None, :]
        if graph.logits_to_keep:
            feeds[graph.logits_to_keep] = np.asarray(1, dtype=np.int64)
        if graph.has_cache_branch:
            # False only on the first step, whose past has zero positions: cache_branch relies on
            # this to run a merged decoder as its with-past branch alone.
            feeds["use_cache_branch"] = np.asarray([total > len(ids)], dtype=np.bool_)
        if self.device == "cpu":
            # One call with OrtValues in and out: the presents come back as OrtValues that feed the
            # next step as they are, without the per-name binding calls (a tenth of a step on a
            # fused graph).
            values = {name: self._ort.OrtValue.ortvalue_from_numpy(array) for name, array in feeds.items()}
            values.update((name, cache[name]) for name in graph.carried)
            outputs = graph.session.run_with_ort_values(["logits", *graph.returned], values)
        else:
            binding = graph.session.io_binding()
            for name, array in feeds.items():
                binding.bind_cpu_input(name, array)
            for name in graph.carried:
                binding.bind_ortvalue_input(name, cache[name])
            binding.bind_output("logits", "cpu")
            for name in graph.returned:
                binding.bind_output(name, self.device)
            graph.session.run_with_iobinding(binding)
            outputs = binding.get_outputs()
        logits = outputs[0].numpy()
        row = np.array(logits[0, -1], dtype=np.float32)
        return row, dict(zip(graph.carried, outputs[1:], strict=True))

    def tokens(
        self,
        prompt: list[int],
        sampler: Sampler,
        *,
        limit: int,
        stop_ids: frozenset[int],
        penalty: float = 1.0,
        prompt_embeds: np.ndarray | None = None,
        prompt_positions: np.ndarray | None = None,
    ) -> Generator[int, None, None]:
        """Yield up to ``limit`` new token ids; an id in ``stop_ids`` is yielded and ends the loop.

        ``prompt_embeds`` replaces the embeddings of the prompt's tokens (images spliced in); it
        needs a graph with a cache. A graph without past inputs is run on the whole sequence each
        step (slower, still correct). ``prompt_positions`` [3, len(prompt)] are an M-RoPE graph's
        prompt positions (images placed on their grids); the tokens after it continue from them.
        """
        sequence = list(prompt)
        with_cache = bool(self.graph.carried)
        cache = self.empty_cache() if with_cache else {}
        pending = list(prompt)
        if prompt_embeds is not None and not with_cache:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{self.graph.label}: images need a decoder with a cache")
        if prompt_positions is not None and not (with_cache and self.graph.mrope):
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"{self.graph.label}: M-RoPE positions need a decoder with a cache reading them"
            )
        # The rope delta: how far the prompt's largest M-RoPE index falls short of its length.
        delta = 0 if prompt_positions is None else int(prompt_positions.max()) + 1 - len(prompt)
        for step in range(limit):
            feed = pending if with_cache else sequence
            first = step == 0
            logits, cache = self.step(
                feed,
                len(sequence),
                cache,
                prompt_embeds if first else None,
                prompt_positions if first else None,
                delta,
            )
            apply_repetition_penalty(logits, sequence, penalty)
            token = sampler.choose(logits)
            yield token
            if token in stop_ids:
                return
            sequence.append(token)
            pending = [token]
