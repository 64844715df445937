"""A causal LM loaded for chat: the handle ``generate`` streams from, with its own KV-cache loop.

The loop is ``model.generate``'s greedy path written out so that each token can be streamed and
the caller can cancel between tokens: one forward pass over the prompt, then one per token with
the cache it returned. At temperature 0 its tokens are exactly ``generate(do_sample=False)``'s.
"""

from __future__ import annotations

import dataclasses
import inspect
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
    render_chat,
    tool_inputs,
)
from anyformer_transformers import BACKEND_ID
from anyformer_transformers.sampling import Sampler


def _ids(value: Any) -> frozenset[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return frozenset({value})
    if isinstance(value, (list, tuple)):
        return frozenset(v for v in value if isinstance(v, int) and not isinstance(v, bool))
    return frozenset()


@dataclasses.dataclass(frozen=True)
class TextSide:
    """The tokenizer, the chat template and the generation defaults of one model."""

    tokenizer: Any
    template: str | None
    bos_token: str
    eos_token: str
    eos_ids: frozenset[int]
    defaults: dict[str, Any]

    @classmethod
    def of(cls, tokenizer: Any, generation: Any) -> TextSide:
        """From transformers' tokenizer and generation config (the template is only read from it, never rendered)."""
        template = getattr(tokenizer, "chat_template", None)
        eos_ids = _ids(getattr(generation, "eos_token_id", None)) | _ids(getattr(tokenizer, "eos_token_id", None))
        defaults = {key: getattr(generation, key, None) for key in ("top_k", "top_p", "repetition_penalty")}
        if not getattr(generation, "do_sample", False):
            defaults = {"repetition_penalty": defaults["repetition_penalty"]}  # top-k/p apply only when it samples
        return cls(
            tokenizer=tokenizer,
            template=template if isinstance(template, str) else None,
            bos_token=str(getattr(tokenizer, "bos_token", None) or ""),
            eos_token=str(getattr(tokenizer, "eos_token", None) or ""),
            eos_ids=eos_ids,
            defaults={k: v for k, v in defaults.items() if v is not None},
        )

    def prompt_ids(self, messages: list[Message], thinking: bool, options: GenerateOptions | None = None) -> list[int]:
        """The rendered prompt's ids (with ``options``' tools); the template writes the special tokens, as
        transformers' own chat does."""
        variables: dict[str, Any] = {}
        if options is not None:
            messages, variables = tool_inputs(self.template, messages, options, "this model")
        text = render_chat(
            self.template,
            messages,
            add_generation_prompt=True,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            enable_thinking=thinking,
            **variables,
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


class ChatModel(BackendModel):
    """The handle: the network, its text side, and the context it was loaded for."""

    backend = BACKEND_ID
    task = "text-generation"
    #: The core's sampling options it applies (its ``repetition_penalty`` is transformers' own rule over every
    #: token so far, not llama.cpp's ``repeat_penalty`` over the reply's last 64: it stays a backend setting).
    #: Constraints too (the core's token mask over the tokenizer's vocabulary), and tools (rendered by the
    #: template, a forced call constrained).
    features = Features(honours=frozenset({"top_p", "top_k", "constraint", "tools"}))

    def __init__(self, network: Any, text: TextSide, *, context: int, details: dict[str, Any]) -> None:
        self._network: Any = network
        # transformers 5.2x renamed the cache argument and output field (``past_key_values`` → ``cache``).
        self._cache_name = "cache" if "cache" in inspect.signature(network.forward).parameters else "past_key_values"
        self.text = text
        self.context = context
        #: What was loaded: class, dtype, device (``anyformer run --verbose`` shows it).
        self.details = details
        #: The vocabulary constraints compile against (llguidance's tokenizer built at the first one).
        self.constraints = ConstraintVocabulary.from_tokenizer(
            text.tokenizer, end_ids=text.eos_ids, install="pip install 'anyformer-transformers[constrained]'"
        )

    def dispose(self) -> None:
        """Drop the network (torch frees its tensors with the last reference); safe to call twice."""
        self._network = None

    def generate(self, messages: list[Message], options: GenerateOptions) -> Iterator[Chunk]:
        """Check the request (``BAD_REQUEST`` before any work), then return the chunk stream."""
        network = self._network
        if network is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "the model was disposed; load it again")
        if has_images(messages) or has_audio(messages):
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"the {BACKEND_ID} backend reads text only: no image or audio")
        prompt = self.text.prompt_ids(messages, options.thinking, options)
        if len(prompt) >= self.context:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"the prompt is {len(prompt)} tokens and the context is {self.context}; load with a larger context",
            )
        constraint = chat_constraint(options, self.text.template)  # a forced call in the template family's syntax
        mask = None if constraint is None else self.constraints.mask_for(constraint)
        sampler = Sampler.for_options(options, self.text.defaults, mask)
        limit = min(options.max_new_tokens, self.context - len(prompt))
        return self._chunks(network, prompt, sampler, limit, options)

    def _chunks(
        self, network: Any, prompt: list[int], sampler: Sampler, limit: int, options: GenerateOptions
    ) -> Iterator[Chunk]:
        import torch

        text = IncrementalDetokenizer(self.text.tokenizer)
        size = len(prompt)
        seen = torch.tensor(prompt, dtype=torch.long)
        count = 0
        inputs = torch.tensor([prompt], dtype=torch.long)
        cache = None
        while not options.cancel.is_set():
            # Inference mode around each pass only: held across a yield it would leak into the caller's thread.
            with torch.inference_mode():
                out = network(input_ids=inputs, use_cache=True, **{self._cache_name: cache})
                cache = getattr(out, self._cache_name)
                token = sampler.choose(out.logits[0, -1], seen)
            if token in self.text.eos_ids:
                yield Chunk(delta=text.flush(), tokens=count, finish_reason="stop", prompt_tokens=size)
                return
            count += 1
            if count >= limit:
                piece = text.add(token) + text.flush()
                yield Chunk(delta=piece, tokens=count, finish_reason="length", prompt_tokens=size)
                return
            if sampler.finished:  # the constraint's value is complete: only the end could follow
                yield Chunk(
                    delta=text.add(token) + text.flush(), tokens=count, finish_reason="stop", prompt_tokens=size
                )
                return
            yield Chunk(delta=text.add(token), tokens=count, prompt_tokens=size)
            seen = torch.cat([seen, torch.tensor([token], dtype=torch.long)])
            inputs = torch.tensor([[token]], dtype=torch.long)
        yield Chunk(delta="", tokens=count, finish_reason="cancelled", prompt_tokens=size)
