"""image-text-to-text chat: a vision-language model whose processor transformers ships, images as message blocks.

The template is the processor's chat template rendered by the core's sandbox with the blocks kept
(``render_chat(blocks=True)``: the template writes its own image placeholder where each image
block sits); the images are the blocks' data, checked and decoded by the core's ``load_image``; the
processor expands each placeholder into the model's image tokens and prepares the pixels. The
first pass takes the pixels with the prompt, the later ones only the new token with the cache, in
the same loop as text chat (``chat_model.py``), so greedy text equals ``model.generate``'s.
Audio blocks are ``BAD_REQUEST``.
"""

from __future__ import annotations

from typing import Any

from anyformer.plugin import (
    AnyformerError,
    ErrorCode,
    GenerateOptions,
    Message,
    has_audio,
    load_image,
    render_chat,
)
from anyformer_transformers import BACKEND_ID
from anyformer_transformers.chat_model import ChatModel, TextSide
from anyformer_transformers.tasks import IMAGE_TEXT_TO_TEXT

#: The most images one chat carries.
MAX_IMAGES = 16


class ImageChatModel(ChatModel):
    """The chat handle of a vision-language model: the text loop, with the processor for image blocks."""

    task = IMAGE_TEXT_TO_TEXT

    def __init__(self, network: Any, text: TextSide, processor: Any, *, context: int, details: dict[str, Any]) -> None:
        super().__init__(network, text, context=context, details=details)
        self._processor: Any = processor

    def media_prompt(
        self, messages: list[Message], options: GenerateOptions, network: Any
    ) -> tuple[list[int], dict[str, Any]]:
        """The processor's ids for the rendered chat and its images, and the pixels (in the network's dtype)."""
        if has_audio(messages):
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"this model reads text and images on the {BACKEND_ID} backend: no audio"
            )
        blocks = [
            block
            for message in messages
            if isinstance(message.get("content"), list)
            for block in message["content"]
            if block.get("type") == "image"
        ]
        if len(blocks) > MAX_IMAGES:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{len(blocks)} images in one chat; at most {MAX_IMAGES}")
        images = [load_image(block["image"], f"image {i}") for i, block in enumerate(blocks)]
        text = render_chat(
            self.text.template,
            messages,
            add_generation_prompt=True,
            bos_token=self.text.bos_token,
            eos_token=self.text.eos_token,
            blocks=True,
            enable_thinking=options.thinking,
        )
        try:
            inputs = self._processor(images=images, text=text, return_tensors="pt")
        except (ValueError, TypeError) as exc:  # e.g. a template that writes no placeholder for an image
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"the model's processor refused the chat: {exc}") from exc
        ids = [int(i) for i in inputs["input_ids"][0].tolist()]
        first = {
            name: value.to(network.device, network.dtype) if value.is_floating_point() else value.to(network.device)
            for name, value in inputs.items()
            if name not in ("input_ids", "attention_mask") and hasattr(value, "to")
        }
        return ids, first
