"""Image blocks in chat messages for a multimodal export with one graph per module (LLaVA-style).

The repo holds ``vision_encoder`` (``pixel_values`` → ``image_features`` [images, n, hidden], the
projector included), ``embed_tokens`` (``input_ids`` → ``inputs_embeds``) and a decoder reading
``inputs_embeds``. Each image block becomes the model's image token (config.json's
``image_token_index`` or ``image_token_id``) as a text block, so the chat template renders it where
the block was; the rendered prompt's image token is then repeated once per feature row the vision
encoder gives, as transformers' processors expand it, and the embeddings at those positions are the
image's features. A template that drops or repeats an image is ``BAD_REQUEST``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode, Message
from anyformer_onnx.image_input import load_image
from anyformer_onnx.text_setup import TextSetup
from anyformer_onnx.vision_models import VisionGraph

#: The most images one conversation may carry.
MAX_IMAGES = 16


def image_token_id(config: Mapping[str, Any]) -> int | None:
    """config.json's image token id (``image_token_index`` or ``image_token_id``), None when it names none."""
    for key in ("image_token_index", "image_token_id"):
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


class ImagePrompter:
    """Turns messages with image blocks into prompt ids and embeddings, the images' features spliced in."""

    def __init__(self, vision: VisionGraph, embed_session: Any, text: TextSetup, token_id: int, label: str) -> None:
        names = [i.name for i in embed_session.get_inputs()]
        if names != ["input_ids"]:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: embed_tokens takes {names}, not input_ids alone")
        if "image_features" not in vision.outputs:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: the vision encoder has no image_features output")
        token = text.tokenizer.id_to_token(token_id)
        if token is None:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: image token id {token_id} is not in tokenizer.json")
        self.vision = vision
        self.embed_session: Any = embed_session
        self.embed_output = embed_session.get_outputs()[0].name
        self.text = text
        self.token = str(token)
        self.token_id = token_id

    def close(self) -> None:
        """Drop the sessions."""
        self.vision.close()
        self.embed_session = None

    def embed(self, ids: list[int]) -> np.ndarray:
        """``inputs_embeds`` [1, len(ids), hidden] for token ids."""
        if self.embed_session is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.vision.label} was disposed")
        (embeds,) = self.embed_session.run([self.embed_output], {"input_ids": np.asarray([ids], dtype=np.int64)})
        return np.asarray(embeds)

    def prompt(self, messages: list[Message], thinking: bool) -> tuple[list[int], np.ndarray | None]:
        """The prompt's token ids (image tokens expanded) and its embeddings; None for a prompt without images."""
        pictures: list[Any] = []

        def swap(block: dict[str, Any]) -> dict[str, Any]:
            if block["type"] != "image":
                return block
            pictures.append(block["image"])
            return {"type": "text", "text": self.token}

        marked: list[Message] = []
        for message in messages:
            content = message["content"]
            marked.append({**message, "content": content if isinstance(content, str) else [swap(b) for b in content]})
        if len(pictures) > MAX_IMAGES:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"{len(pictures)} images; at most {MAX_IMAGES} per conversation"
            )
        ids = list(self.text.tokenizer.encode(self.text.render(marked, thinking), add_special_tokens=False).ids)
        placed = ids.count(self.token_id)
        if placed != len(pictures):
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"the prompt holds {placed} image tokens for {len(pictures)} images (a template that drops or "
                f"repeats an image, or the text {self.token!r} typed in a message)",
            )
        if not pictures:
            return ids, None
        features = []
        for index, picture in enumerate(pictures):
            (rows,) = self.vision.run(load_image(picture, f"image {index}"), ["image_features"])
            features.append(rows.reshape(-1, rows.shape[-1]))
        expanded: list[int] = []
        starts: list[int] = []
        for token in ids:
            if token == self.token_id:
                starts.append(len(expanded))
                expanded.extend([token] * features[len(starts) - 1].shape[0])
            else:
                expanded.append(token)
        embeds = self.embed(expanded).copy()
        for start, rows in zip(starts, features, strict=True):
            if rows.shape[-1] != embeds.shape[-1]:
                raise AnyformerError(
                    ErrorCode.BAD_MODEL,
                    f"{self.vision.label}: image features of width {rows.shape[-1]}, embeddings of {embeds.shape[-1]}",
                )
            embeds[0, start : start + rows.shape[0]] = rows.astype(embeds.dtype)
        return expanded, embeds
