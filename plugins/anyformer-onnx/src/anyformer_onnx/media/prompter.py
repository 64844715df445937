"""Image and audio blocks in chat messages for a multimodal export with one graph per module.

The repo holds ``embed_tokens`` (``input_ids`` → ``inputs_embeds``), a decoder reading
``inputs_embeds``, and a ``vision_encoder`` (``pixel_values`` → ``image_features`` [images, n,
hidden], the projector included; LLaVA-style), an ``audio_encoder`` (log-mel ``input_features`` →
``audio_features`` [1, n, hidden]; Qwen2-Audio-style, :mod:`media.audio_encoder`) or both. Each media
block is first given to the chat template as a block of its kind (``render_chat(blocks=True)``, as
transformers' processors give it): a multimodal template writes its own placeholder where the block
sits, and that rendering is kept when it holds each kind's token once per block — the prompt
transformers renders. Otherwise (a template for text only, ChatML) each block becomes its kind's
stand-in text as a text block, so the chat template renders it where the block was: the image
token (config.json's ``image_token_index`` or ``image_token_id``), the audio token
(``audio_token_index`` or ``audio_token_id``) between the processor's ``audio_bos_token`` and
``audio_eos_token`` when it has them. The rendered prompt's media token is then repeated once per
feature row its encoder gives, as transformers' processors expand it, and the embeddings at those
positions are the block's features. A template that drops or repeats a block, or a media token
typed in a message, is ``BAD_REQUEST``; so is a block of a kind the model has no encoder for.

A Gemma 4 export (:mod:`media.gemma4_image`) writes ``<|image>`` and ``<image|>`` around each image's run
of image tokens, and its embed_tokens reads the media tokens as the pad token (``media_pad``).

A Qwen2-VL-family export (:mod:`media.qwen_vl_image`) writes an image as
``<|vision_start|><|image_pad|><|vision_end|>``; its encoder also returns each image's patch grid,
from which the prompt's M-RoPE positions [3, seq] are computed (:mod:`chat.mrope`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode, Message, load_image
from anyformer_onnx.chat.mrope import Grid, rope_index
from anyformer_onnx.chat.per_layer import PER_LAYER_INPUTS
from anyformer_onnx.text.setup import TextSetup

#: The most images one conversation may carry.
MAX_IMAGES = 16
#: The most audio clips one conversation may carry.
MAX_CLIPS = 16
#: What each block kind is called in messages, for refusals.
_NOUNS = {"image": "images", "audio": "audio clips"}


def _token_id(config: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def image_token_id(config: Mapping[str, Any]) -> int | None:
    """config.json's image token id (``image_token_index`` or ``image_token_id``), None when it names none."""
    return _token_id(config, ("image_token_index", "image_token_id"))


def audio_token_id(config: Mapping[str, Any]) -> int | None:
    """config.json's audio token id (``audio_token_index`` or ``audio_token_id``), None when it names none."""
    return _token_id(config, ("audio_token_index", "audio_token_id"))


@dataclasses.dataclass(frozen=True)
class MediaKind:
    """One kind of media block a model reads: its prompt token, the text a block becomes, its encoder."""

    #: The block type in messages: ``image`` or ``audio``.
    block: str
    token_id: int
    #: The text a block of this kind becomes before the template renders it (holds the token once).
    stand_in: str
    #: The block's value and a name for messages → its feature rows [n, hidden], or the rows and
    #: the image's patch grid (an encoder whose decoder places images by M-RoPE).
    encode: Callable[[Any, str], np.ndarray | tuple[np.ndarray, Grid]]
    limit: int
    #: Token ids written before and after each block's run of media tokens as the prompt is expanded
    #: (Gemma 4's processor writes ``<|image>`` and ``<image|>`` around an image's soft tokens).
    around: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())


@dataclasses.dataclass(frozen=True)
class PreparedPrompt:
    """A multimodal prompt: token ids (media tokens expanded), embeddings, and M-RoPE positions."""

    ids: list[int]
    #: ``inputs_embeds`` [1, len(ids), hidden] with the media features spliced in; None without media.
    embeds: np.ndarray | None
    #: ``position_ids`` rows [3, len(ids)] for an M-RoPE decoder given images; None otherwise (plain positions).
    positions: np.ndarray | None = None


def image_kind(vision: Any, text: TextSetup, token_id: int, label: str) -> MediaKind:
    """Image blocks read by a vision graph with an ``image_features`` output."""
    if "image_features" not in vision.outputs:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: the vision encoder has no image_features output")

    def encode(value: Any, what: str) -> np.ndarray:
        (rows,) = vision.run(load_image(value, what), ["image_features"])
        return np.asarray(rows).reshape(-1, rows.shape[-1])

    return MediaKind("image", token_id, _token_text(text, token_id, "image", label), encode, MAX_IMAGES)


def audio_kind(audio: Any, text: TextSetup, token_id: int, wrappers: tuple[str, str], label: str) -> MediaKind:
    """Audio blocks read by an :class:`~anyformer_onnx.media.audio_encoder.AudioGraph`.

    ``wrappers`` are the processor's ``audio_bos_token`` and ``audio_eos_token`` (empty when it has
    none): Qwen2-Audio's template writes ``<|audio_bos|><|AUDIO|><|audio_eos|>`` for a clip.
    """
    token = _token_text(text, token_id, "audio", label)
    for wrapper in wrappers:
        if wrapper and text.tokenizer.token_to_id(wrapper) is None:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: the processor's {wrapper!r} is not in tokenizer.json")
    return MediaKind("audio", token_id, f"{wrappers[0]}{token}{wrappers[1]}", audio.encode, MAX_CLIPS)


def qwen_image_kind(vision: Any, text: TextSetup, token_id: int, wrappers: tuple[int, int], label: str) -> MediaKind:
    """Image blocks of a Qwen2-VL-family export: a :class:`~anyformer_onnx.media.qwen_vl_image.QwenVisionGraph`.

    ``wrappers`` are config.json's ``vision_start_token_id`` and ``vision_end_token_id``: an image
    is written ``<|vision_start|><|image_pad|><|vision_end|>``, as the model's chat template does.
    """
    start, end = (_token_text(text, wrapper, "vision start/end", label) for wrapper in wrappers)
    token = _token_text(text, token_id, "image", label)
    return MediaKind("image", token_id, f"{start}{token}{end}", vision.encode, MAX_IMAGES)


def _token_text(text: TextSetup, token_id: int, kind: str, label: str) -> str:
    token = text.tokenizer.id_to_token(token_id)
    if token is None:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: {kind} token id {token_id} is not in tokenizer.json")
    return str(token)


class MediaPrompter:
    """Turns messages with media blocks into prompt ids and embeddings, each block's features spliced in."""

    def __init__(
        self,
        embed_session: Any,
        text: TextSetup,
        kinds: list[MediaKind],
        closers: list[Any],
        label: str,
        mrope_merge: int | None = None,
        unread: str | None = None,
        media_pad: tuple[frozenset[int], int] | None = None,
    ):
        names = [i.name for i in embed_session.get_inputs()]
        if names != ["input_ids"]:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: embed_tokens takes {names}, not input_ids alone")
        self.embed_session: Any = embed_session
        outputs = [o.name for o in embed_session.get_outputs()]
        #: The embeddings output: ``inputs_embeds`` where the graph names it, else its first output.
        self.embed_output = "inputs_embeds" if "inputs_embeds" in outputs else outputs[0]
        #: Whether embed_tokens also returns ``per_layer_inputs`` (Gemma 3n, Gemma 4's small models).
        self.per_layer = PER_LAYER_INPUTS in outputs
        self.text = text
        self.kinds = {kind.block: kind for kind in kinds}
        self.label = label
        self._closers = closers
        #: Why the repo's media encoders are not read (a decoder with per-layer inputs), for refusals.
        self.unread = unread
        #: The vision encoder's spatial merge size when the decoder reads M-RoPE positions, else None.
        self.mrope_merge = mrope_merge
        #: Media token ids embed_tokens reads as another id, and that id (Gemma 4: its image, video and
        #: audio tokens as ``pad_token_id``, as transformers swaps them before both embeddings, so the
        #: per-layer inputs at media positions are the pad token's); None: ids are embedded as they are.
        self.media_pad = media_pad

    @property
    def reads_audio(self) -> bool:
        """True when the model has an audio encoder."""
        return "audio" in self.kinds

    def close(self) -> None:
        """Drop the sessions."""
        for graph in self._closers:
            graph.close()
        self.embed_session = None

    def embed(self, ids: list[int]) -> np.ndarray:
        """``inputs_embeds`` [1, len(ids), hidden] for token ids."""
        return self._run(ids, [self.embed_output])[0]

    def embed_inputs(self, ids: list[int]) -> dict[str, np.ndarray]:
        """The decoder's inputs for ids: ``inputs_embeds`` and, where embed_tokens has it, ``per_layer_inputs``."""
        names = [self.embed_output, *([PER_LAYER_INPUTS] if self.per_layer else [])]
        return dict(zip(["inputs_embeds", *names[1:]], self._run(ids, names), strict=True))

    def _run(self, ids: list[int], names: list[str]) -> list[np.ndarray]:
        if self.embed_session is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.label} was disposed")
        if self.media_pad is not None:
            media, pad = self.media_pad
            ids = [pad if token in media else token for token in ids]
        found = self.embed_session.run(names, {"input_ids": np.asarray([ids], dtype=np.int64)})
        return [np.asarray(value) for value in found]

    def _marked(self, messages: list[Message]) -> tuple[list[Message], dict[str, list[Any]]]:
        """The messages with each media block as its stand-in text, and the blocks' values by kind."""
        found: dict[str, list[Any]] = {block: [] for block in self.kinds}

        def swap(block: dict[str, Any]) -> dict[str, Any]:
            if block["type"] == "text":
                return block
            kind = self.kinds.get(block["type"])
            if kind is None and self.unread:
                raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.label}: no {block['type']} blocks: {self.unread}")
            if kind is None:
                have, missing = " and ".join(sorted(self.kinds)) or "no media", block["type"]
                raise AnyformerError(
                    ErrorCode.BAD_REQUEST,
                    f"{self.label} reads {have} blocks: it has no {missing} encoder, so no {missing} blocks",
                )
            found[kind.block].append(block[kind.block])
            return {"type": "text", "text": kind.stand_in}

        marked: list[Message] = []
        for message in messages:
            content = message["content"]
            marked.append({**message, "content": content if isinstance(content, str) else [swap(b) for b in content]})
        for block, values in found.items():
            if len(values) > self.kinds[block].limit:
                raise AnyformerError(
                    ErrorCode.BAD_REQUEST,
                    f"{len(values)} {_NOUNS[block]}; at most {self.kinds[block].limit} per conversation",
                )
        return marked, found

    def prompt(self, messages: list[Message], thinking: bool) -> tuple[list[int], np.ndarray | None]:
        """The prompt's token ids (media tokens expanded) and its embeddings; None for a prompt without media."""
        prepared = self.prepare(messages, thinking)
        return prepared.ids, prepared.embeds

    def _rendered_ids(
        self, messages: list[Message], marked: list[Message], found: dict[str, list[Any]], thinking: bool
    ) -> list[int]:
        """The rendered prompt's ids: the template given the blocks themselves where it writes each kind's token
        once per block (a multimodal template), else the messages with each block's stand-in text."""

        def encoded(text: str) -> list[int]:
            return list(self.text.tokenizer.encode(text, add_special_tokens=False).ids)

        if any(found.values()):
            ids = encoded(self.text.render(messages, thinking, blocks=True))
            if all(ids.count(kind.token_id) == len(found[kind.block]) for kind in self.kinds.values()):
                return ids
        return encoded(self.text.render(marked, thinking))

    def prepare(self, messages: list[Message], thinking: bool) -> PreparedPrompt:
        """The prompt's ids (media tokens expanded), embeddings and, for an M-RoPE decoder with images, positions."""
        marked, found = self._marked(messages)
        ids = self._rendered_ids(messages, marked, found, thinking)
        by_token = {kind.token_id: kind for kind in self.kinds.values()}
        for kind in self.kinds.values():
            placed = ids.count(kind.token_id)
            if placed != len(found[kind.block]):
                raise AnyformerError(
                    ErrorCode.BAD_REQUEST,
                    f"the prompt holds {placed} {kind.block} tokens for {len(found[kind.block])} {_NOUNS[kind.block]} "
                    f"(a template that drops or repeats one, or the text {kind.stand_in!r} typed in a message)",
                )
        if not any(found.values()):
            return PreparedPrompt(ids, None)
        # Each block's features, in prompt order (the template keeps the messages' order).
        features: dict[str, list[np.ndarray]] = {block: [] for block in found}
        grids: list[Grid] = []
        for block, values in found.items():
            for index, value in enumerate(values):
                encoded = self.kinds[block].encode(value, f"{block} {index}")
                if isinstance(encoded, tuple):
                    encoded, grid = encoded
                    grids.append(grid)
                features[block].append(encoded)
        expanded: list[int] = []
        spliced: list[tuple[int, np.ndarray]] = []
        used = dict.fromkeys(found, 0)
        for token in ids:
            media = by_token.get(token)
            if media is None:
                expanded.append(token)
                continue
            rows = features[media.block][used[media.block]]
            used[media.block] += 1
            expanded.extend(media.around[0])
            spliced.append((len(expanded), rows))
            expanded.extend([token] * rows.shape[0])
            expanded.extend(media.around[1])
        embeds = self.embed(expanded).copy()
        for start, rows in spliced:
            if rows.shape[-1] != embeds.shape[-1]:
                raise AnyformerError(
                    ErrorCode.BAD_MODEL,
                    f"{self.label}: media features of width {rows.shape[-1]}, embeddings of {embeds.shape[-1]}",
                )
            embeds[0, start : start + rows.shape[0]] = rows.astype(embeds.dtype)
        positions = None
        if self.mrope_merge is not None and "image" in self.kinds:
            positions, _ = rope_index(expanded, self.kinds["image"].token_id, grids, self.mrope_merge)
        return PreparedPrompt(expanded, embeds, positions)
