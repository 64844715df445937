"""kohra's three hooks and its handle: text-diffusion language models (MDLM, BD3LM) on onnxruntime.

- ``can_run`` accepts a repo tagged ``text-diffusion`` with one of kohra's graphs, from the
  description alone (no file opened, onnxruntime not imported);
- ``load`` picks the graph for the provider onnxruntime offers, fetches it with its external data
  and tokenizer files, checks the graph's external data, then opens it;
- the handle's ``generate`` (:class:`KohraModel`) renders the conversation with the chat template,
  denoises the answer (MDLM: all at once; BD3LM, tag ``block-diffusion``: block by block) and
  streams the settled text;
- ``store_list`` is empty: kohra keeps nothing beyond the Hub cache the core lists.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from anyformer.plugin import (
    AnyformerError,
    BackendModel,
    Caps,
    Chunk,
    ErrorCode,
    Estimate,
    GenerateOptions,
    Message,
    Model,
    ProgressCallback,
    ProgressEvent,
    Rank,
    Refusal,
    Request,
    StoreEntry,
    Verdict,
    fetch_files,
    format_size,
    has_images,
    hookimpl,
    read_config_json,
)
from anyformer_kohra.graphs import GRAPHS, external_data_files, graph_bytes, pick_graph
from anyformer_kohra.ort_providers import CPU, handles_fp16, onnxruntime_installed, planned_provider
from anyformer_kohra.text_codec import TOKENIZER_FILES

#: This backend's id: the name of its entry point.
BACKEND = "kohra"
TASK = "text-generation"
DIFFUSION_TAG = "text-diffusion"
BLOCK_TAG = "block-diffusion"
#: BD3LM's block length when config.json has no ``block_size``.
DEFAULT_BLOCK_SIZE = 4
#: Host memory besides the weights: onnxruntime's arenas, the tokenizer, the logits of a step.
RAM_OVERHEAD = 256 * 2**20
#: Accelerator memory besides the weights: activations and the logits of a step.
GPU_OVERHEAD = 128 * 2**20
#: The largest 4-D attention mask kohra builds for one call (it grows with the square of the sequence).
MASK_LIMIT = 512 * 2**20


class KohraModel(BackendModel):
    """The handle ``load`` returns: the graph runner, the tokenizer and the model's diffusion facts.

    It declares no ``features``: its sampler reads no optional option, so the core refuses them all.
    """

    def __init__(self, runner: Any, codec: Any, *, blocks: bool, block_size: int, max_length: int | None) -> None:
        self.backend = BACKEND
        self.task = TASK
        self.runner = runner
        self.codec = codec
        self.blocks = blocks
        self.block_size = block_size
        self.max_length = max_length

    def generate(self, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
        """Denoise a reply to ``messages`` and stream it as it settles."""
        if self.runner is None or self.codec is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "the model was disposed; load it again")
        if has_images(messages):
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, "kohra runs text-only diffusion models; image blocks are refused"
            )
        return _generation(self, messages, options)

    def dispose(self) -> None:
        """Release the onnxruntime session; a second call does nothing."""
        self.runner = None
        self.codec = None


def _graph_summary(model: Model, provider: str) -> str:
    fp16 = "" if handles_fp16(provider) else f" ({GRAPHS[0]} needs an fp16 provider; {provider} is not one)"
    return f"no kohra graph ({', '.join(GRAPHS)}) in {model.ref}{fp16}"


@hookimpl
def can_run(model: Model, caps: Caps, request: Request) -> Verdict:
    """Accept a ``text-diffusion`` repo with a kohra graph for text generation, if memory holds it."""
    # The format first: the core's install hint for the right backend comes from format refusals.
    if not any(model.file(name) is not None for name in GRAPHS):
        return Verdict.refuse(BACKEND, Refusal.FORMAT, f"no kohra graph ({', '.join(GRAPHS)}) in {model.ref}")
    if DIFFUSION_TAG not in model.tags:
        return Verdict.refuse(BACKEND, Refusal.MODEL, f"{model.ref} is not tagged {DIFFUSION_TAG}")
    task = request.task or model.task or TASK
    if task != TASK:
        return Verdict.refuse(BACKEND, Refusal.TASK, f"runs {TASK} only, not {task}")
    provider = planned_provider(caps)
    graph = pick_graph(model, handles_fp16(provider))
    if graph is None:
        return Verdict.refuse(BACKEND, Refusal.FORMAT, _graph_summary(model, provider))
    if model.source == "hub" and graph.path is None and not caps.store:
        return Verdict.refuse(BACKEND, Refusal.STORE, f"{graph.name} must be downloaded and the store is not writable")
    weights = graph_bytes(model, graph)
    on_gpu = provider != CPU
    if on_gpu:
        gpu_need = weights + GPU_OVERHEAD
        budget = request.budget_or(caps.gpu_bytes)
        if budget < gpu_need:
            return Verdict.refuse(
                BACKEND,
                Refusal.BUDGET,
                f"{graph.name} needs {format_size(gpu_need)} on {provider}, the budget is {format_size(budget)}",
                need=gpu_need,
            )
    # On the CPU the weights live in host memory, and onnxruntime's optimized copy may double them.
    ram_need = RAM_OVERHEAD + (weights if on_gpu else 2 * weights)
    if caps.ram_bytes < ram_need:
        return Verdict.refuse(
            BACKEND,
            Refusal.MEMORY,
            f"{graph.name} needs {format_size(ram_need)} of host memory, {format_size(caps.ram_bytes)} available",
            need=ram_need,
        )
    if not onnxruntime_installed():
        return Verdict.refuse(BACKEND, Refusal.RUNTIME, "onnxruntime is not installed: pip install onnxruntime")
    kind = "BD3LM (block diffusion)" if BLOCK_TAG in model.tags else "MDLM (masked diffusion)"
    files = [graph.name, *(f.name for f in external_data_files(model, graph.name))]
    files += [name for name in TOKENIZER_FILES if model.file(name) is not None]
    return Verdict.accept(
        BACKEND,
        Estimate(
            gpu_bytes=weights + GPU_OVERHEAD if on_gpu else 0,
            ram_bytes=ram_need,
            disk_bytes=weights,
            rank=Rank.SPECIALIST,
            details={"graph": graph.name, "provider": provider, "denoising": kind},
            files=tuple(files),
        ),
    )


def _int_config(config: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@hookimpl
def load(model: Model, request: Request, progress: ProgressCallback) -> KohraModel:
    """Fetch and open the graph for onnxruntime's provider, with the tokenizer and chat template."""
    if not onnxruntime_installed():
        raise AnyformerError(ErrorCode.BAD_REQUEST, "onnxruntime is not installed: pip install onnxruntime")
    import onnxruntime as ort

    from anyformer_kohra.denoiser import GraphRunner, inspect_graph
    from anyformer_kohra.ort_providers import session_providers
    from anyformer_kohra.ort_session import open_session
    from anyformer_kohra.text_codec import load_codec

    provider = session_providers(ort.get_available_providers())[0]
    graph = pick_graph(model, handles_fp16(provider))
    if graph is None:
        raise AnyformerError(ErrorCode.BAD_MODEL, _graph_summary(model, provider))
    names = [graph.name, *(f.name for f in external_data_files(model, graph.name))]
    names += [name for name in TOKENIZER_FILES if model.file(name) is not None]
    paths: dict[str, Path] = fetch_files(model, names, progress, backend=BACKEND)
    progress(ProgressEvent(stage="load", file=graph.name))
    config = read_config_json(paths["config.json"], "config.json") if "config.json" in paths else {}
    codec = load_codec(paths)
    session, _ = open_session(paths[graph.name])
    runner = GraphRunner(session, inspect_graph(session, config))
    blocks = BLOCK_TAG in model.tags
    if blocks and not (runner.spec.has_cache or runner.spec.can_recompute_blocks):
        raise AnyformerError(
            ErrorCode.BAD_MODEL,
            f"{graph.name}: a block-diffusion graph needs past_key_values.* / present.* for its finished blocks, "
            "or a 4-D attention_mask input so kohra can make its attention block-causal",
        )
    return KohraModel(
        runner,
        codec,
        blocks=blocks,
        block_size=_int_config(config, "block_size") or DEFAULT_BLOCK_SIZE,
        max_length=_int_config(config, "model_length", "max_position_embeddings", "max_seq_len"),
    )


def _generation(handle: KohraModel, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
    # numpy and the sampler are imported here, not at module level: `anyformer check` imports this module.
    import numpy as np

    from anyformer_kohra.chat_prompt import render_prompt
    from anyformer_kohra.denoiser import CachedBlockDenoiser, FullSequenceDenoiser, RecomputedBlockDenoiser
    from anyformer_kohra.options import parse_options
    from anyformer_kohra.sampler import SamplerSettings, sample_blocks, sample_mdlm
    from anyformer_kohra.streaming import stream_states

    codec, runner = handle.codec, handle.runner
    diffusion = parse_options(
        options.extra,
        max_new_tokens=options.max_new_tokens,
        temperature=options.temperature,
        default_block=handle.block_size if handle.blocks else None,
    )
    prompt = np.asarray(render_prompt(codec, messages, thinking=options.thinking), dtype=np.int64)
    length = options.max_new_tokens
    if handle.max_length is not None:
        room = handle.max_length - len(prompt)
        if room < 1:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"the prompt is {len(prompt)} tokens; the model reads {handle.max_length} in all, leaving no room",
            )
        length = min(length, room)
    spec = runner.spec
    if spec.mask_is_4d and not (handle.blocks and spec.has_cache):
        # MDLM and cacheless BD3LM feed a [sequence, sequence] mask; at its longest the whole sequence.
        from anyformer_kohra.attention_masks import mask_bytes

        total = len(prompt) + length
        if mask_bytes(total, total, spec.mask_dtype) > MASK_LIMIT:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"{total} tokens need a {format_size(mask_bytes(total, total, spec.mask_dtype))} attention mask on "
                f"this graph (no key/value cache), over kohra's {format_size(MASK_LIMIT)}: ask for fewer new tokens",
            )
    settings = SamplerSettings(
        mask_id=codec.mask_id,
        steps=diffusion.steps,
        method=diffusion.method,
        temperature=options.temperature,
        seed=options.seed,
        cache=diffusion.cache,
        block_size=diffusion.block_size,
    )

    def states() -> Iterator[Any]:
        # The denoiser is built here, inside the stream: BD3LM's first model call (the prompt) is work.
        if handle.blocks and runner.spec.has_cache:
            yield from sample_blocks(CachedBlockDenoiser(runner, prompt), length, settings)
        elif handle.blocks:
            # No cache: each step recomputes the prompt and finished blocks under a block-causal mask.
            yield from sample_blocks(RecomputedBlockDenoiser(runner, prompt), length, settings)
        else:
            yield from sample_mdlm(FullSequenceDenoiser(runner, prompt), length, settings)

    return stream_states(states(), codec, options, diffusion, prompt_tokens=len(prompt), blocks=handle.blocks)


@hookimpl
def store_list() -> list[StoreEntry]:
    """Nothing: kohra derives no files; the Hub cache it downloads into is listed by the core."""
    return []
