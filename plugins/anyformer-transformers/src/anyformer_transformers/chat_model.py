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
    TokenLogprob,
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
    #: template, a forced call constrained). It continues raw prompts (``generate(prompt=...)``,
    #: ``/v1/completions``), with ``logprobs`` there.
    features = Features(honours=frozenset({"top_p", "top_k", "constraint", "tools"}), raw_text=True)

    def __init__(self, network: Any, text: TextSide, *, context: int, details: dict[str, Any]) -> None:
        self._network: Any = network
        parameters = inspect.signature(network.forward).parameters
        # transformers 5.2x renamed the cache argument and output field (``past_key_values`` → ``cache``).
        self._cache_name = "cache" if "cache" in parameters else "past_key_values"
        # Only the last position's logits are read: as ``generate``, the LM head runs on that row alone.
        self._last_only = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
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
        first: dict[str, Any] = {}
        if options.prompt is None and (has_images(messages) or has_audio(messages)):
            prompt, first = self.media_prompt(messages, options, network)
        elif options.prompt is not None:
            if options.suffix is not None:
                raise AnyformerError(
                    ErrorCode.BAD_REQUEST, f"the {BACKEND_ID} backend does not fill in the middle (suffix)"
                )
            # A raw prompt as transformers' own text generation tokenizes it: the tokenizer's special tokens (BOS).
            prompt = list(self.text.tokenizer(options.prompt)["input_ids"])
        else:
            prompt = self.text.prompt_ids(messages, options.thinking, options)
        if not prompt:
            raise AnyformerError(ErrorCode.BAD_REQUEST, "the prompt is empty once tokenized")
        if len(prompt) >= self.context:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"the prompt is {len(prompt)} tokens and the context is {self.context}; load with a larger context",
            )
        constraint = chat_constraint(options, self.text.template)  # a forced call in the template family's syntax
        mask = None if constraint is None else self.constraints.mask_for(constraint)
        sampler = Sampler.for_options(options, self.text.defaults, mask)
        limit = min(options.max_new_tokens, self.context - len(prompt))
        return self._chunks(network, prompt, sampler, limit, options, first)

    def media_prompt(
        self, messages: list[Message], options: GenerateOptions, network: Any
    ) -> tuple[list[int], dict[str, Any]]:
        """The prompt's ids and the first pass's other inputs (pixels…) for a chat with media blocks;
        a text-only model refuses them (``image_chat_model.py`` reads images)."""
        raise AnyformerError(
            ErrorCode.BAD_REQUEST, f"this model reads text only on the {BACKEND_ID} backend: no image or audio"
        )

    def _scored(self, logits: Any, token: int, alternatives: int) -> tuple[TokenLogprob, ...]:
        """The chosen token's log-probability under the raw logits, and the ``alternatives`` likeliest."""
        import torch

        values = torch.log_softmax(logits.float(), dim=-1)
        top = torch.topk(values, min(alternatives, values.shape[0]))
        decode = self.text.tokenizer.decode
        pairs = [(int(i), float(v)) for v, i in zip(top.values.tolist(), top.indices.tolist(), strict=True)]
        if token not in {i for i, _ in pairs}:
            pairs.append((token, float(values[token])))
        shown = tuple((str(decode([i])), v) for i, v in pairs)
        return (TokenLogprob(str(decode([token])), float(values[token]), shown),)

    def _chunks(
        self,
        network: Any,
        prompt: list[int],
        sampler: Sampler,
        limit: int,
        options: GenerateOptions,
        first: dict[str, Any],
    ) -> Iterator[Chunk]:
        import torch

        text = IncrementalDetokenizer(self.text.tokenizer)
        size = len(prompt)
        # Every id so far, for the repetition penalty: one buffer written in place, never copied per token.
        seen = torch.empty(size + limit, dtype=torch.long)
        seen[:size] = torch.tensor(prompt, dtype=torch.long)
        count = 0
        device = network.device
        inputs = torch.tensor([prompt], dtype=torch.long, device=device)
        step = torch.empty((1, 1), dtype=torch.long, device=device)
        cache = None
        while not options.cancel.is_set():
            # Inference mode around each pass only: held across a yield it would leak into the caller's thread.
            with torch.inference_mode():
                extra = first if cache is None else {}  # the media go in with the prompt's pass only
                out = network(input_ids=inputs, use_cache=True, **{self._cache_name: cache}, **self._last_only, **extra)
                cache = getattr(out, self._cache_name)
                logits = out.logits[0, -1].cpu()
                token = sampler.choose(logits, seen[: size + count])
                scored = self._scored(logits, token, options.logprobs) if options.logprobs is not None else ()
            del out, logits  # the logits of this step are not held through the yield
            if token in self.text.eos_ids:
                yield Chunk(delta=text.flush(), tokens=count, finish_reason="stop", prompt_tokens=size)
                return
            seen[size + count] = token
            count += 1
            if count >= limit:
                piece = text.add(token) + text.flush()
                yield Chunk(delta=piece, tokens=count, finish_reason="length", prompt_tokens=size, logprobs=scored)
                return
            if sampler.finished:  # the constraint's value is complete: only the end could follow
                yield Chunk(
                    delta=text.add(token) + text.flush(),
                    tokens=count,
                    finish_reason="stop",
                    prompt_tokens=size,
                    logprobs=scored,
                )
                return
            yield Chunk(delta=text.add(token), tokens=count, prompt_tokens=size, logprobs=scored)
            step[0, 0] = token
            inputs = step
        yield Chunk(delta="", tokens=count, finish_reason="cancelled", prompt_tokens=size)
