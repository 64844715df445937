"""The ONNX graph as a denoiser: which inputs and outputs it has, and how each call feeds them.

The graph conventions are those of Hub ONNX exports (optimum / transformers.js naming):

- ``input_ids`` (int64 ``[batch, sequence]``) with the mask token where a position is masked;
- optional time input: ``sigma`` (the total noise, as MDLM's DiT takes it) or ``timesteps`` /
  ``timestep`` / ``t`` (the time in [0, 1]); a graph with one is *time-conditioned*;
- optional ``attention_mask``: 2-D ``[batch, key]`` (all ones), or 4-D ``[batch, 1, query, key]``
  (see :mod:`anyformer_kohra.attention_masks`), which lets kohra choose who attends to whom;
- optional ``position_ids`` (counted from the cached length);
- optional ``past_key_values.{i}.key`` / ``.value`` inputs with ``present.{i}.key`` / ``.value``
  outputs ``[batch, heads, sequence, head_dim]``: the key/value cache BD3LM keeps for finished blocks;
- ``logits`` (``[batch, sequence, vocab]``; the first output when none has that name).

Float inputs and outputs may be fp16 (an fp16 export): kohra feeds each input in the graph's own
type and reads the logits back as float32.

MDLM feeds the prompt and the whole answer on every call (attention is bidirectional, so the prompt's
states depend on the answer). BD3LM runs the prompt once, then each block against the cache; a
finished block is run once more, clean, to add its keys/values. A BD3LM graph without a cache but
with a 4-D mask is run the other way the BD3LM reference knows: every call recomputes the prompt,
the finished blocks and the current one under a block-causal mask.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_kohra.attention_masks import block_causal, block_segments, encode_mask, full_mask

_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_SIGMA_NAMES = ("sigma",)
_TIME_NAMES = ("timesteps", "timestep", "t")
_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}
_MASK_TYPES = {**_NUMPY_TYPES, "tensor(bool)": np.bool_, "tensor(int64)": np.int64, "tensor(int32)": np.int32}


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    """The inputs and outputs of a diffusion graph that kohra feeds and reads."""

    time_input: str | None
    #: True when the time input is sigma (total noise); False when it is t in [0, 1].
    time_is_sigma: bool
    time_dtype: Any
    attention_mask: str | None
    #: True when ``attention_mask`` is 4-D ``[batch, 1, query, key]``; False when it is 2-D or absent.
    mask_is_4d: bool
    mask_dtype: Any
    position_ids: str | None
    #: ``(key input, value input, key output, value output)`` per layer, in layer order.
    cache: tuple[tuple[str, str, str, str], ...]
    cache_heads: int
    cache_head_dim: int
    cache_dtype: Any
    logits: str

    @property
    def has_cache(self) -> bool:
        """True when the graph takes and returns a key/value cache."""
        return bool(self.cache)

    @property
    def can_recompute_blocks(self) -> bool:
        """True when kohra can give the graph block-causal attention itself (a 4-D attention mask)."""
        return self.mask_is_4d


def _fixed(dim: Any) -> int | None:
    return dim if isinstance(dim, int) and dim > 0 else None


def inspect_graph(session: Any, config: dict[str, Any]) -> GraphSpec:
    """Read the graph's inputs and outputs; ``BAD_MODEL`` when it is not a diffusion LM graph kohra can feed."""
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    if "input_ids" not in inputs:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"the graph has no input_ids input (inputs: {', '.join(inputs)})")
    time_input = next((n for n in (*_SIGMA_NAMES, *_TIME_NAMES) if n in inputs), None)
    layers: dict[int, dict[str, str]] = {}
    for name in inputs:
        match = _PAST.match(name)
        if match:
            layers.setdefault(int(match.group(1)), {})[match.group(2)] = name
    cache = []
    for index in sorted(layers):
        pair = layers[index]
        present = (f"present.{index}.key", f"present.{index}.value")
        if set(pair) != {"key", "value"} or not all(p in outputs for p in present):
            raise AnyformerError(ErrorCode.BAD_MODEL, f"the graph's key/value cache for layer {index} is incomplete")
        cache.append((pair["key"], pair["value"], *present))
    known = {"input_ids", time_input, "attention_mask", "position_ids"} | {n for c in cache for n in c[:2]}
    unknown = [n for n in inputs if n not in known]
    if unknown:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"the graph takes inputs kohra does not know: {', '.join(unknown)}")
    heads = head_dim = 0
    cache_dtype: Any = np.float32
    if cache:
        first = inputs[cache[0][0]]
        shape = list(first.shape) if len(first.shape) == 4 else [None] * 4
        heads = _fixed(shape[1]) or int(config.get("num_key_value_heads") or config.get("num_attention_heads") or 0)
        hidden = int(config.get("hidden_size") or 0)
        head_dim = _fixed(shape[3]) or int(
            config.get("head_dim") or (hidden // int(config.get("num_attention_heads") or 1))
        )
        if not heads or not head_dim:
            raise AnyformerError(
                ErrorCode.BAD_MODEL, "the graph's key/value cache shape is unknown (no config.json heads)"
            )
        cache_dtype = _NUMPY_TYPES.get(first.type, np.float32)
    logits = "logits" if "logits" in outputs else outputs[0]
    mask = inputs.get("attention_mask")
    mask_rank = len(mask.shape) if mask is not None and isinstance(mask.shape, list) else 0
    if mask is not None and mask.type not in _MASK_TYPES:
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"the graph's attention_mask has a type kohra cannot feed: {mask.type}"
        )
    if mask is not None and mask_rank not in (2, 4):
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"the graph's attention_mask has rank {mask_rank}; kohra feeds 2 or 4"
        )
    return GraphSpec(
        time_input=time_input,
        time_is_sigma=time_input in _SIGMA_NAMES,
        time_dtype=_NUMPY_TYPES.get(inputs[time_input].type, np.float32) if time_input else np.float32,
        attention_mask="attention_mask" if mask is not None else None,
        mask_is_4d=mask_rank == 4,
        mask_dtype=_MASK_TYPES[mask.type] if mask is not None else np.int64,
        position_ids="position_ids" if "position_ids" in inputs else None,
        cache=tuple(cache),
        cache_heads=heads,
        cache_head_dim=head_dim,
        cache_dtype=cache_dtype,
        logits=logits,
    )


class GraphRunner:
    """Feeds one graph call: ids, the time, masks, positions and the cache, and counts the calls."""

    def __init__(self, session: Any, spec: GraphSpec) -> None:
        self.session = session
        self.spec = spec
        self.calls = 0
        self._output_names = [spec.logits] + [name for layer in spec.cache for name in layer[2:]]

    @property
    def time_conditioned(self) -> bool:
        """True when the graph sees the noise level."""
        return self.spec.time_input is not None

    def empty_cache(self) -> list[np.ndarray]:
        """A zero-length cache, for a call with nothing before it."""
        shape = (1, self.spec.cache_heads, 0, self.spec.cache_head_dim)
        return [np.zeros(shape, dtype=self.spec.cache_dtype) for _ in range(2 * len(self.spec.cache))]

    def run(
        self, ids: np.ndarray, sigma: float, cache: list[np.ndarray] | None, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Logits ``[len(ids), vocab]`` (float32) and the cache after ``ids`` (empty without one).

        ``allowed`` (bool ``[len(ids), cached + len(ids)]``) says which keys each query may attend to;
        None lets every query see every key. Only a graph with a 4-D attention mask can take one.
        """
        spec = self.spec
        cached = cache[0].shape[2] if cache else 0
        if allowed is not None and not spec.mask_is_4d:
            raise ValueError("this graph takes no 4-D attention mask")
        feed: dict[str, np.ndarray] = {"input_ids": ids.astype(np.int64)[None]}
        if spec.time_input is not None:
            t = sigma if spec.time_is_sigma else -np.expm1(-sigma)
            feed[spec.time_input] = np.array([t], dtype=spec.time_dtype)
        if spec.attention_mask is not None and spec.mask_is_4d:
            feed[spec.attention_mask] = (
                full_mask(len(ids), cached + len(ids), spec.mask_dtype)
                if allowed is None
                else encode_mask(allowed, spec.mask_dtype)
            )
        elif spec.attention_mask is not None:
            feed[spec.attention_mask] = np.ones((1, cached + len(ids)), dtype=spec.mask_dtype)
        if spec.position_ids is not None:
            feed[spec.position_ids] = np.arange(cached, cached + len(ids), dtype=np.int64)[None]
        if spec.has_cache:
            past = cache if cache is not None else self.empty_cache()
            for (key_in, value_in, _, _), key, value in zip(spec.cache, past[0::2], past[1::2], strict=True):
                feed[key_in] = key
                feed[value_in] = value
        try:
            outputs = self.session.run(self._output_names, feed)
        except Exception as exc:  # onnxruntime's own exception types
            # onnxruntime reports an allocation failure as a RuntimeException naming it.
            code = ErrorCode.OUT_OF_MEMORY if "allocate" in str(exc).lower() else ErrorCode.BAD_MODEL
            raise AnyformerError(code, f"the graph failed to run: {exc}", cause=exc) from exc
        self.calls += 1
        logits = np.asarray(outputs[0])
        if logits.ndim != 3 or logits.shape[1] != len(ids):
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"the graph's logits have shape {logits.shape}, expected [1, {len(ids)}, vocab]"
            )
        return logits[0].astype(np.float32), list(outputs[1:])


class FullSequenceDenoiser:
    """MDLM: every call runs the prompt and the whole answer, and reads the answer's logits."""

    def __init__(self, runner: GraphRunner, prompt: np.ndarray) -> None:
        self.runner = runner
        self.prompt = prompt.astype(np.int64)
        self.time_conditioned = runner.time_conditioned
        # The runner lives as long as the model; this generation counts its own calls.
        self._calls_before = runner.calls

    @property
    def calls(self) -> int:
        """Graph calls made by this denoiser."""
        return self.runner.calls - self._calls_before

    def logits(self, tokens: np.ndarray, sigma: float) -> np.ndarray:
        """Logits for the answer positions, the prompt before them."""
        logits, _ = self.runner.run(np.concatenate([self.prompt, tokens]), sigma, None)
        return logits[len(self.prompt) :]


class CachedBlockDenoiser:
    """BD3LM: the prompt and finished blocks live in the key/value cache; a call runs the current block only."""

    def __init__(self, runner: GraphRunner, prompt: np.ndarray) -> None:
        if not runner.spec.has_cache:
            raise AnyformerError(
                ErrorCode.BAD_MODEL,
                "a block-diffusion graph must expose past_key_values.* and present.* for its finished blocks",
            )
        self.runner = runner
        self.time_conditioned = runner.time_conditioned
        self._calls_before = runner.calls
        _, self.cache = runner.run(prompt.astype(np.int64), 0.0, None)

    @property
    def calls(self) -> int:
        """Graph calls made by this denoiser, the prompt's included."""
        return self.runner.calls - self._calls_before

    def logits(self, tokens: np.ndarray, sigma: float) -> np.ndarray:
        """Logits for the current block, attending to the cache and to the block itself."""
        logits, _ = self.runner.run(tokens, sigma, self.cache)
        return logits

    def commit(self, tokens: np.ndarray) -> None:
        """Run a finished block clean (noise level 0) and keep its keys/values."""
        _, self.cache = self.runner.run(tokens, 0.0, self.cache)


class RecomputedBlockDenoiser:
    """BD3LM without a cache: every call runs the prompt, the finished blocks and the current one, block-causally.

    The prompt is one segment and each block another; a position attends to its own segment and the
    earlier ones (:func:`~anyformer_kohra.attention_masks.block_causal`), so the finished blocks'
    states are the ones the cached path keeps, and the current block's logits match it. Each call
    costs the whole sequence so far, where the cached path costs one block. On a time-conditioned
    graph the whole sequence sees the current noise level (as in the BD3LM reference without its
    cache), where the cached path ran the finished blocks clean.
    """

    def __init__(self, runner: GraphRunner, prompt: np.ndarray) -> None:
        if not runner.spec.can_recompute_blocks:
            raise AnyformerError(
                ErrorCode.BAD_MODEL,
                "a block-diffusion graph without past_key_values.* / present.* needs a 4-D attention_mask input",
            )
        self.runner = runner
        self.time_conditioned = runner.time_conditioned
        self._calls_before = runner.calls
        self._context = prompt.astype(np.int64)
        self._prompt_length = len(prompt)
        self._blocks: list[int] = []

    @property
    def calls(self) -> int:
        """Graph calls made by this denoiser (one per step: the prompt and commits cost none)."""
        return self.runner.calls - self._calls_before

    def logits(self, tokens: np.ndarray, sigma: float) -> np.ndarray:
        """Logits for the current block, the whole sequence so far run under the block-causal mask."""
        sequence = np.concatenate([self._context, tokens.astype(np.int64)])
        allowed = block_causal(block_segments(self._prompt_length, [*self._blocks, len(tokens)]))
        logits, _ = self.runner.run(sequence, sigma, None, allowed)
        return logits[len(self._context) :]

    def commit(self, tokens: np.ndarray) -> None:
        """Fix a finished block: later calls run it again, never changed."""
        self._context = np.concatenate([self._context, tokens.astype(np.int64)])
        self._blocks.append(len(tokens))
