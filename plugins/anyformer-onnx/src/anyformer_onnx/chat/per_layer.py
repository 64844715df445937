"""Decoders with per-layer inputs: Gemma 3n and Gemma 4's small models, exported one graph per module.

These models feed each decoder layer a second embedding of the token (a row of a separate
per-layer table, ``hidden_size_per_layer_input`` wide per layer) beside the residual stream.
transformers.js's exports (onnx-community's Gemma 3n and Gemma 4 repos) carry it between graphs:

- ``embed_tokens``: ``input_ids`` [batch, seq] int64 → ``inputs_embeds`` [batch, seq, hidden] and
  ``per_layer_inputs`` [batch, seq, layers, per_layer_width], both of the graph's float type; ids
  outside the per-layer table (``vocab_size_per_layer_input``: the media tokens) read its row 0;
- ``decoder_model_merged``: ``inputs_embeds``, ``per_layer_inputs``, ``attention_mask``,
  ``position_ids`` and ``past_key_values.N.key/value`` → ``logits`` and ``present.N.key/value``.
  The decoder projects the embeddings into the per-layer space and mixes in ``per_layer_inputs``
  itself; KV-shared layers have no cache entries of their own, so N runs over the layers that
  compute keys and values.

Every step runs ``embed_tokens`` on its own tokens and feeds both outputs, as transformers.js's
``Gemma3nForConditionalGeneration`` does; the cache is the ordinary past/present one.

Gemma 4's vision and audio encoders are read (:mod:`gemma4_image`, :mod:`gemma4_audio`: image and
audio blocks reach them) unless its decoder attends bidirectionally over media tokens
(``use_bidirectional_attention: "vision"``, which the decoder graph's plain ``attention_mask``
cannot carry). Gemma 3n's towers (MobileNet v5 for images, a USM conformer with its own feature
extractor for audio) are not: those encoders are left unfetched and their blocks are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The input that carries the per-layer embeddings from ``embed_tokens`` to the decoder.
PER_LAYER_INPUTS = "per_layer_inputs"
#: What these models are, for messages.
FAMILY = "a decoder with per-layer inputs (Gemma 3n, Gemma 4's small models)"


def declares_per_layer_inputs(config: Mapping[str, Any]) -> bool:
    """True when config.json (or its ``text_config``) gives the decoder a per-layer input width."""
    text = config.get("text_config")
    decoder = text if isinstance(text, Mapping) else config
    width = decoder.get("hidden_size_per_layer_input")
    return isinstance(width, int) and not isinstance(width, bool) and width > 0


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def per_layer_encoders(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The encoder stems read beside a decoder with per-layer inputs: Gemma 4's, else none."""
    if config.get("model_type") != "gemma4" or _text_config(config).get("use_bidirectional_attention") == "vision":
        return ()
    return ("vision_encoder", "audio_encoder")


def unread_media(config: Mapping[str, Any]) -> str:
    """Why a per-layer model's other media blocks are refused (for messages)."""
    if per_layer_encoders(config):
        return "Gemma 4 reads image and audio blocks where its repo has that encoder"
    if _text_config(config).get("use_bidirectional_attention") == "vision":
        return (
            f"{FAMILY} attending bidirectionally over images (use_bidirectional_attention 'vision') is read "
            "for text chat only: the decoder graph's attention_mask cannot carry that"
        )
    return f"{FAMILY} is read for text chat; its vision and audio encoders are not"
