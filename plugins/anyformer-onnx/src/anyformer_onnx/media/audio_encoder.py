"""A multimodal export's ``audio_encoder`` graph: one clip's log-mel features in, its audio token rows out.

The graph takes ``input_features`` [1, mel bins, frames] (Whisper's log-mel spectrogram of the clip
padded to the feature extractor's window, :mod:`media.log_mel`) and, when it asks, the feature
extractor's mask of real frames (``feature_attention_mask``, ``input_features_mask`` or
``attention_mask``: ones for the first ``ceil(samples / hop)`` frames, as Whisper's feature
extractor returns it with ``return_attention_mask=True``). It returns ``audio_features``: one row
per audio token of the prompt, the projector into the decoder's width included, only the clip's
own rows (Qwen2-Audio's processor writes as many tokens as the encoder keeps rows for the real
frames; the fixture's export drops the padding rows inside the graph).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_onnx.media.audio_input import IN_CHAT_WINDOW, load_audio
from anyformer_onnx.media.log_mel import LogMel

#: Names of the real-frames mask input, as exporters spell it.
MASK_INPUTS = ("feature_attention_mask", "input_features_mask", "attention_mask")
_MASK_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


def feature_extractor_config(preprocessor: Mapping[str, Any] | None, processor: Mapping[str, Any] | None) -> Any:
    """The feature extractor's settings: ``preprocessor_config.json``, else ``processor_config.json``'s entry.

    transformers 5 saves a processor's parts inside ``processor_config.json`` (``"feature_extractor":
    {...}``); older repos keep them in ``preprocessor_config.json``. None when neither has them.
    """
    if preprocessor and ("feature_size" in preprocessor or "feature_extractor_type" in preprocessor):
        return preprocessor
    nested = processor.get("feature_extractor") if processor else None
    return nested if isinstance(nested, Mapping) else None


def real_frames(front_end: LogMel, samples: int) -> int:
    """The frames of a clip of ``samples`` the mask marks real: Whisper's sample mask taken every ``hop`` samples."""
    return min(math.ceil(samples / front_end.hop), front_end.samples // front_end.hop)


class AudioGraph:
    """An ``audio_encoder`` session with the model's log-mel front end (see the module docstring)."""

    def __init__(self, session: Any, front_end: LogMel, label: str) -> None:
        inputs = {i.name: i for i in session.get_inputs()}
        outputs = [o.name for o in session.get_outputs()]
        masks = [name for name in MASK_INPUTS if name in inputs]
        unknown = sorted(set(inputs) - {"input_features", *masks})
        if "input_features" not in inputs or unknown or len(masks) > 1:
            wanted = unknown[0] if unknown else "input_features"
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: not an audio encoder this backend feeds ({wanted})")
        if "audio_features" not in outputs:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: the audio encoder has no audio_features output")
        shape = list(inputs["input_features"].shape)
        if len(shape) != 3 or (isinstance(shape[1], int) and shape[1] != front_end.bands):
            raise AnyformerError(
                ErrorCode.BAD_MODEL,
                f"{label}: the audio encoder takes input_features of shape {shape}, not "
                f"[batch, {front_end.bands} mel bins, frames] as the feature extractor gives",
            )
        self.mask = masks[0] if masks else None
        self.mask_type: Any = _MASK_TYPES.get(inputs[self.mask].type) if self.mask else None
        if self.mask and self.mask_type is None:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: {self.mask} of type {inputs[self.mask].type}")
        self.session: Any = session
        self.front_end = front_end
        self.label = label

    def close(self) -> None:
        """Drop the session; later calls are ``BAD_REQUEST``."""
        self.session = None

    def encode(self, value: Any, what: str) -> np.ndarray:
        """The rows [n, width] one audio block becomes; ``BAD_REQUEST`` for audio the front end refuses."""
        if self.session is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.label} was disposed")
        front = self.front_end
        audio = load_audio(value, front.rate, front.seconds, what, IN_CHAT_WINDOW)
        features = front(audio)[None]
        feeds: dict[str, np.ndarray] = {"input_features": features}
        if self.mask:
            mask = np.zeros((1, features.shape[2]), dtype=self.mask_type)
            mask[0, : real_frames(front, audio.size)] = 1
            feeds[self.mask] = mask
        (rows,) = self.session.run(["audio_features"], feeds)
        rows = np.asarray(rows)
        if rows.ndim < 2:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{self.label}: audio_features of shape {rows.shape}")
        if rows.size == 0:  # Qwen2-Audio keeps no row for a clip under ~20 ms
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{what} is too short: the audio encoder keeps no row of it")
        return rows.reshape(-1, rows.shape[-1])
