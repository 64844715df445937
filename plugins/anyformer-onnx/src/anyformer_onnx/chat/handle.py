"""A decoder-only ONNX model loaded for chat: the handle ``generate`` streams from."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from anyformer.plugin import (
    AnyformerError,
    BackendModel,
    Chunk,
    ConstraintVocabulary,
    ErrorCode,
    Features,
    GenerateOptions,
    IncrementalDetokenizer,
    Message,
    chat_constraint,
    has_audio,
    has_images,
    tool_inputs,
)
from anyformer_onnx import BACKEND_ID
from anyformer_onnx.chat.decoder import DecodeLoop, DecoderGraph
from anyformer_onnx.chat.sampling import Sampler
from anyformer_onnx.media.prompter import MediaPrompter
from anyformer_onnx.tasks.names import TEXT_GENERATION
from anyformer_onnx.text.setup import TextSetup


class OnnxChatModel(BackendModel):
    """A loaded decoder graph, its text side and the context it was loaded for."""

    backend = BACKEND_ID
    task = TEXT_GENERATION
    #: The sampling options its sampler reads, constraints (the core's token mask over tokenizer.json's
    #: vocabulary) and tools (rendered by the template, a forced call constrained; not for a multimodal
    #: export); the core refuses the others (``min_p``…).
    features = Features(honours=frozenset({"top_p", "top_k", "constraint", "tools"}))

    def __init__(
        self,
        graph: DecoderGraph,
        text: TextSetup,
        *,
        device: str,
        context: int,
        details: dict[str, Any],
        media: MediaPrompter | None = None,
        task: str = TEXT_GENERATION,
    ):
        self.task = task
        self._graph: DecoderGraph | None = graph
        #: What reads image and audio blocks (a multimodal export); None for a text-only model.
        self.media = media
        #: The core hands this handle messages with audio blocks only when its model has an audio encoder.
        self.features = dataclasses.replace(self.features, audio_input=media is not None and media.reads_audio)
        self._loop: DecodeLoop | None = DecodeLoop(graph, device, media.embed_inputs if media else None)
        self.text = text
        self.context = context
        #: What was loaded: file, precision, provider (shown by ``anyformer run --verbose`` and tests).
        self.details = details
        #: The vocabulary constraints compile against (llguidance's tokenizer built at the first one).
        self.constraints = ConstraintVocabulary.from_tokenizer(
            text.tokenizer, end_ids=text.eos_ids, install="pip install 'anyformer-onnx[constrained]'"
        )

    @property
    def loop(self) -> DecodeLoop:
        """The decode loop; ``BAD_REQUEST`` after ``dispose``."""
        if self._loop is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.details.get('file', 'the model')} was disposed")
        return self._loop

    def dispose(self) -> None:
        """Drop the session (onnxruntime frees it with the last reference); safe to call twice."""
        self._loop = None
        self._graph = None
        if self.media is not None:
            self.media.close()

    def sampler(self, options: GenerateOptions) -> Sampler:
        """The sampler for one call: the model's top-k and top-p unless ``options.extra`` overrides them."""
        top_k = options.extra.get("top_k", self.text.top_k)
        top_p = options.extra.get("top_p", self.text.top_p)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"top_k must be an integer ≥ 0, got {top_k!r}")
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"top_p must be a number in (0, 1], got {top_p!r}")
        constraint = chat_constraint(options, self.text.template)  # a forced call in the template family's syntax
        mask = None if constraint is None else self.constraints.mask_for(constraint)
        return Sampler(options.temperature, top_k, float(top_p), options.seed, mask)

    def penalty(self, options: GenerateOptions) -> float:
        """The repetition penalty: ``options.extra['repetition_penalty']``, else generation_config.json's."""
        value = options.extra.get("repetition_penalty", self.text.repetition_penalty)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"repetition_penalty must be a number > 0, got {value!r}")
        return float(value)

    def generate(self, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
        """Check the request (``BAD_REQUEST`` before any work), then return the chunk stream."""
        loop = self.loop
        embeds = positions = None
        if self.media is not None:
            if options.tools:  # the media prompter renders its own template, without tools
                raise AnyformerError(ErrorCode.BAD_REQUEST, "tools: not rendered for a multimodal ONNX export")
            prepared = self.media.prepare(messages, options.thinking)
            prompt, embeds, positions = prepared.ids, prepared.embeds, prepared.positions
        elif has_images(messages) or has_audio(messages):
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"{self.details.get('file')} is a text-only model: no image or audio blocks"
            )
        else:
            label = str(self.details.get("file", "this model"))
            messages, variables = tool_inputs(self.text.template, messages, options, label)
            prompt = self.text.prompt_ids(messages, options.thinking, variables)
        if len(prompt) >= self.context:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"the prompt is {len(prompt)} tokens and the context is {self.context}; load with a larger context",
            )
        sampler = self.sampler(options)
        penalty = self.penalty(options)
        limit = min(options.max_new_tokens, self.context - len(prompt))
        return self._chunks(loop, prompt, sampler, penalty, limit, options, embeds, positions)

    def _chunks(
        self,
        loop: DecodeLoop,
        prompt: list[int],
        sampler: Sampler,
        penalty: float,
        limit: int,
        options: GenerateOptions,
        embeds: Any = None,
        positions: Any = None,
    ) -> Iterator[Chunk]:
        text = IncrementalDetokenizer(self.text.tokenizer)
        size = len(prompt)
        count = 0
        tokens = loop.tokens(
            prompt,
            sampler,
            limit=limit,
            stop_ids=self.text.eos_ids,
            penalty=penalty,
            prompt_embeds=embeds,
            prompt_positions=positions,
        )
        try:
            while not options.cancel.is_set():
                token = next(tokens, None)
                if token is None:
                    yield Chunk(delta=text.flush(), tokens=count, finish_reason="length", prompt_tokens=size)
                    return
                if token in self.text.eos_ids:
                    yield Chunk(delta=text.flush(), tokens=count, finish_reason="stop", prompt_tokens=size)
                    return
                count += 1
                if count >= limit:
                    yield Chunk(
                        delta=text.add(token) + text.flush(), tokens=count, finish_reason="length", prompt_tokens=size
                    )
                    return
                if sampler.finished:  # the constraint's value is complete: only the end could follow
                    yield Chunk(
                        delta=text.add(token) + text.flush(), tokens=count, finish_reason="stop", prompt_tokens=size
                    )
                    return
                yield Chunk(delta=text.add(token), tokens=count, prompt_tokens=size)
            yield Chunk(delta="", tokens=count, finish_reason="cancelled", prompt_tokens=size)
        finally:
            tokens.close()
