"""What Gemma 4's image and audio blocks share: their token ids, their processor settings, their prompt tokens.

A media block is its token, once per row its encoder returns, between a begin and an end token
(``<|image>`` … ``<image|>``, ``<|audio>`` … ``<audio|>``). config.json names the ids
``*_token_id`` (or ``*_token_index``); ``Gemma4Config``'s own ids stand in for one it leaves out.
The processor's part for a kind (``image_processor``, ``feature_extractor``) sits in
processor_config.json, as transformers 5 and transformers.js save a Gemma 4 processor, or in
preprocessor_config.json.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_onnx.media.prompter import MediaKind
from anyformer_onnx.text.setup import TextSetup

#: ``Gemma4Config``'s token ids, for a config.json that leaves one out.
DEFAULT_TOKENS = {
    "image_token_id": 258_880,
    "boi_token_id": 255_999,
    "eoi_token_id": 258_882,
    "video_token_id": 258_884,
    "audio_token_id": 258_881,
    "boa_token_id": 256_000,
    "eoa_token_id": 258_883,
}


def gemma4_token(config: Mapping[str, Any], key: str) -> int:
    """The id config.json gives ``key`` (a ``*_token_id``, or its ``*_token_index`` spelling), else Gemma 4's own."""
    for name in (key, key.replace("_id", "_index")):
        value = config.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return DEFAULT_TOKENS[key]


def processor_part(
    processor: Mapping[str, Any] | None, preprocessor: Mapping[str, Any] | None, part: str, kind: str, label: str
) -> Mapping[str, Any]:
    """processor_config.json's ``part`` entry, else preprocessor_config.json; ``BAD_MODEL`` when neither is there."""
    nested = processor.get(part) if processor else None
    settings = nested if isinstance(nested, Mapping) else preprocessor
    if settings is None:
        raise AnyformerError(
            ErrorCode.BAD_MODEL,
            f"{label}: Gemma 4 {kind} chat needs the {part.replace('_', ' ')}'s settings "
            f"(processor_config.json's {part}, or preprocessor_config.json)",
        )
    return settings


def gemma4_media_kind(
    kind: str,
    keys: tuple[str, str, str],
    encode: Callable[[Any, str], np.ndarray],
    limit: int,
    text: TextSetup,
    config: Mapping[str, Any],
    label: str,
) -> MediaKind:
    """The blocks of one kind: the token of ``keys[0]`` between those of ``keys[1]`` and ``keys[2]``.

    ``BAD_MODEL`` when one of the three ids is not in tokenizer.json.
    """
    found = []
    for key in keys:
        token = gemma4_token(config, key)
        if text.tokenizer.id_to_token(token) is None:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: config.json's {key} {token} is not in tokenizer.json")
        found.append(token)
    name = str(text.tokenizer.id_to_token(found[0]))
    return MediaKind(kind, found[0], name, encode, limit, around=((found[1],), (found[2],)))


def gemma4_media_pad(config: Mapping[str, Any]) -> tuple[frozenset[int], int]:
    """The media token ids (image, video, audio) and the pad id embed_tokens reads them as.

    transformers' ``Gemma4Model`` swaps each media token for ``text_config.pad_token_id`` before
    embedding, so the per-layer inputs at image positions are the pad token's (and the decoder mixes
    them with its projection of the image features themselves); a media token the model generates
    is embedded as the pad token too.
    """
    text = config.get("text_config")
    pad = text.get("pad_token_id", 0) if isinstance(text, Mapping) else 0
    pad = pad if isinstance(pad, int) and not isinstance(pad, bool) and pad >= 0 else 0
    return frozenset(gemma4_token(config, key) for key in ("image_token_id", "video_token_id", "audio_token_id")), pad
