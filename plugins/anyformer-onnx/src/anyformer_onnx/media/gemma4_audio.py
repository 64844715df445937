"""Gemma 4 audio: the USM feature extractor's log-mel features and mask, the audio encoder that reads them.

The feature extractor (transformers' ``Gemma4AudioFeatureExtractor``; its keys sit under
``feature_extractor`` in ``processor_config.json``, or in ``preprocessor_config.json``), for one
clip of float samples at ``sampling_rate`` (16 kHz):

- padded with zeros to a multiple of 128 samples (the extractor's ``pad_to_multiple_of``), the
  samples marked real or padding; scaled by ``input_scale_factor``;
- ``frame_length_ms`` / 2 zeros put before it (semicausal: the first frame centred at t = 0), then
  frames of ``frame_length + 1`` samples every ``hop_length`` (20 ms and 10 ms: 320 + 1 and 160);
  each frame's first ``frame_length`` samples (or, with ``preemphasis``, the pre-emphasised ones,
  HTK-style by default) times a periodic Hann window, through a real FFT of the next power of two
  (512; doubled with ``fft_overdrive``); the magnitude (not the power) through ``feature_size``
  (128) triangular HTK-scale mel filters from ``min_frequency`` to ``max_frequency`` (0 to 8 kHz,
  unnormalised); ``log(mel + mel_floor)``; minus ``per_bin_mean``, over ``per_bin_stddev`` where given;
- a frame is real when the last sample of its window is; padding frames' features are zeroed.

The encoder keeps every other frame twice over (two stride-2 convolutions), so a clip's audio
tokens are the real frames among ``mask[::2][::2]``; the processor writes ``<|audio>``, that many
``<|audio|>`` and ``<audio|>`` for it.

The ``audio_encoder`` graph (onnx-community's layout) takes ``input_features`` [1, frames,
feature_size] and ``input_features_mask`` [1, frames] (bool) and returns ``audio_features``: one
row per audio token (the encoder's rows of real frames, projected into the text model's embedding
space), or a row for every subsampled frame, of which the real ones are kept here.

Not done as transformers does: a clip over the extractor's ``max_length`` (30 s) is ``BAD_REQUEST``
instead of cut, and ``dither`` (random noise, 0 by default) is not added.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_onnx.media.audio_input import IN_CHAT_WINDOW, load_audio
from anyformer_onnx.media.gemma4_media import gemma4_media_kind, processor_part
from anyformer_onnx.media.prompter import MAX_CLIPS, MediaKind
from anyformer_onnx.text.setup import TextSetup

#: The extractor pads each clip to a multiple of this many samples.
PAD_TO_MULTIPLE = 128
#: The extractor's ``max_length`` (30 s at 16 kHz): longer clips it would cut are refused here.
MAX_SAMPLES = 480_000


def _number(config: Mapping[str, Any], key: str, default: float, label: str) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: the Gemma 4 feature extractor's {key} is {value!r}")
    return float(value)


def _bins(value: Any, bands: int, key: str, label: str) -> np.ndarray | None:
    if value is None:
        return None
    # transformers saves these as it holds them, [1, 1, bands]: any nesting of ``bands`` numbers is read.
    try:
        found = np.asarray(value, dtype=np.float64).reshape(-1) if isinstance(value, (list, tuple)) else None
    except (TypeError, ValueError):
        found = None
    if found is None or found.shape != (bands,) or not np.all(np.isfinite(found)):
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"{label}: the Gemma 4 feature extractor's {key} is not {bands} numbers"
        )
    return found


def htk_mel_filters(bins: int, bands: int, low: float, high: float, rate: int) -> np.ndarray:
    """Triangular filters [bins, bands] over ``bins`` FFT frequencies from 0 to rate/2, spaced on the HTK mel scale.

    Edges evenly spaced in mels from ``low`` to ``high`` Hz; each filter rises from its lower edge to
    its centre and falls to its upper edge, unnormalised (transformers' ``mel_filter_bank`` with
    ``norm=None, mel_scale="htk"``).
    """

    def to_mel(hertz: float) -> float:
        return 2595.0 * math.log10(1.0 + hertz / 700.0)

    mels = np.linspace(to_mel(low), to_mel(high), bands + 2)
    edges = 700.0 * (10.0 ** (mels / 2595.0) - 1.0)
    frequencies = np.linspace(0, rate // 2, bins)
    widths = np.diff(edges)
    slopes = edges[None, :] - frequencies[:, None]
    falling = -slopes[:, :-2] / widths[:-1]
    rising = slopes[:, 2:] / widths[1:]
    return np.maximum(np.zeros(1), np.minimum(falling, rising))


@dataclasses.dataclass(frozen=True)
class Gemma4LogMel:
    """The features and real-frame mask one Gemma 4 model asks for (see the module docstring)."""

    rate: int
    bands: int
    frame: int
    hop: int
    fft: int
    filters: np.ndarray
    preemphasis: float
    htk_preemphasis: bool
    scale: float
    floor: float
    mean: np.ndarray | None
    std: np.ndarray | None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], label: str) -> Gemma4LogMel:
        """Read the feature extractor's settings; ``BAD_MODEL`` for another extractor or values out of range."""
        kind = config.get("feature_extractor_type", "Gemma4AudioFeatureExtractor")
        if kind != "Gemma4AudioFeatureExtractor":
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: a Gemma 4 audio encoder with a {kind}")
        rate = int(_number(config, "sampling_rate", 16_000, label))
        bands = int(_number(config, "feature_size", 128, label))
        frame = round(rate * _number(config, "frame_length_ms", 20.0, label) / 1000.0)
        hop = round(rate * _number(config, "hop_length_ms", 10.0, label) / 1000.0)
        low = _number(config, "min_frequency", 0.0, label)
        high = _number(config, "max_frequency", 8000.0, label)
        if rate <= 0 or bands <= 0 or frame <= 0 or hop <= 0 or not 0 <= low < high <= rate / 2:
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"{label}: the Gemma 4 feature extractor's sizes are out of range"
            )
        fft = 2 ** math.ceil(math.log2(frame)) * (2 if config.get("fft_overdrive") else 1)
        return cls(
            rate=rate,
            bands=bands,
            frame=frame,
            hop=hop,
            fft=fft,
            filters=htk_mel_filters(fft // 2 + 1, bands, low, high, rate),
            preemphasis=_number(config, "preemphasis", 0.0, label),
            htk_preemphasis=bool(config.get("preemphasis_htk_flavor", True)),
            scale=_number(config, "input_scale_factor", 1.0, label),
            floor=_number(config, "mel_floor", 1e-3, label),
            mean=_bins(config.get("per_bin_mean"), bands, "per_bin_mean", label),
            std=_bins(config.get("per_bin_stddev"), bands, "per_bin_stddev", label),
        )

    def __call__(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``input_features`` [frames, bands] float32 and the real-frame mask [frames] for one clip's samples."""
        count = samples.shape[0]
        length = -(-count // PAD_TO_MULTIPLE) * PAD_TO_MULTIPLE
        wave = np.zeros(length, dtype=np.float32)
        wave[:count] = samples.astype(np.float32)
        if self.scale != 1.0:
            wave = wave * self.scale
        left = self.frame // 2
        wave = np.concatenate([np.zeros(left, dtype=wave.dtype), wave])
        real = np.zeros(wave.shape[0], dtype=bool)
        real[left : left + count] = True
        size = self.frame + 1
        if wave.shape[0] < size:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"a clip of {count} samples is too short for one frame")
        frames = np.lib.stride_tricks.sliding_window_view(wave, size)[:: self.hop]
        if self.preemphasis > 0.0 and self.htk_preemphasis:
            first = frames[:, :1] * (1.0 - self.preemphasis)
            frames = np.concatenate([first, frames[:, 1:-1] - self.preemphasis * frames[:, :-2]], axis=-1)
        elif self.preemphasis > 0.0:
            frames = frames[:, 1:] - self.preemphasis * frames[:, :-1]
        else:
            frames = frames[:, :-1]
        window = np.hanning(self.frame + 1)[:-1].astype(np.float32)  # periodic Hann
        magnitude = np.abs(np.fft.rfft(frames * window, n=self.fft, axis=-1))
        log = np.log(magnitude @ self.filters + np.float64(self.floor))
        if self.mean is not None:
            log = log - self.mean
        if self.std is not None:
            log = log / self.std
        mask = real[np.arange(log.shape[0]) * self.hop + size - 1]
        return log.astype(np.float32) * mask[:, None], mask


def audio_tokens(mask: np.ndarray) -> int:
    """A clip's audio token count: its real frames among those the encoder's two stride-2 convolutions keep."""
    return int(mask[::2][::2].sum())


class Gemma4AudioGraph:
    """An ``audio_encoder`` session taking features and their mask (see the module docstring)."""

    def __init__(self, session: Any, front_end: Gemma4LogMel, label: str) -> None:
        inputs = {i.name: i for i in session.get_inputs()}
        outputs = [o.name for o in session.get_outputs()]
        if set(inputs) != {"input_features", "input_features_mask"}:
            unknown = sorted(set(inputs) - {"input_features", "input_features_mask"})
            wanted = unknown[0] if unknown else "input_features and input_features_mask"
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"{label}: not a Gemma 4 audio encoder this backend feeds ({wanted})"
            )
        shape = list(inputs["input_features"].shape)
        if len(shape) != 3 or (isinstance(shape[2], int) and shape[2] != front_end.bands):
            raise AnyformerError(
                ErrorCode.BAD_MODEL,
                f"{label}: the audio encoder takes input_features of shape {shape}, not "
                f"[1, frames, {front_end.bands}] as the feature extractor gives",
            )
        self.session: Any = session
        self.front_end = front_end
        self.label = label
        self.output = "audio_features" if "audio_features" in outputs else outputs[0]
        mask_type = inputs["input_features_mask"].type
        self.mask_type: Any = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}.get(mask_type, np.bool_)
        self.feature_type: Any = np.float16 if inputs["input_features"].type == "tensor(float16)" else np.float32

    def close(self) -> None:
        """Drop the session; later calls are ``BAD_REQUEST``."""
        self.session = None

    def encode(self, value: Any, what: str) -> np.ndarray:
        """One audio block's rows [audio tokens, hidden]; ``BAD_REQUEST`` for audio refused or too short to keep."""
        if self.session is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.label} was disposed")
        front = self.front_end
        samples = load_audio(value, front.rate, MAX_SAMPLES / front.rate, what, IN_CHAT_WINDOW)
        features, mask = front(samples)
        tokens = audio_tokens(mask)
        if tokens == 0:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{what} is too short: the audio encoder keeps no row of it")
        feeds = {
            "input_features": features[None].astype(self.feature_type),
            "input_features_mask": mask[None].astype(self.mask_type),
        }
        (rows,) = self.session.run([self.output], feeds)
        rows = np.asarray(rows)
        rows = rows.reshape(-1, rows.shape[-1])
        kept = mask[::2][::2]
        if rows.shape[0] == kept.shape[0] != tokens:  # a row per subsampled frame: keep the real ones
            rows = rows[kept]
        if rows.shape[0] != tokens:
            raise AnyformerError(
                ErrorCode.BAD_MODEL,
                f"{self.label}: {rows.shape[0]} audio_features rows for {what}; the processor writes {tokens} "
                "audio tokens for it",
            )
        return rows


def gemma4_audio_kind(
    session: Any,
    text: TextSetup,
    config: Mapping[str, Any],
    preprocessor: Mapping[str, Any] | None,
    processor: Mapping[str, Any] | None,
    label: str,
) -> tuple[Gemma4AudioGraph, MediaKind]:
    """Gemma 4's audio encoder and its audio blocks: the audio token, wrapped in ``<|audio>`` … ``<audio|>``.

    The feature extractor's settings come from processor_config.json's ``feature_extractor``, else
    preprocessor_config.json; ``BAD_MODEL`` when neither has them or a token is not in tokenizer.json.
    """
    settings = processor_part(processor, preprocessor, "feature_extractor", "audio", label)
    graph = Gemma4AudioGraph(session, Gemma4LogMel.from_config(settings, label), label)
    keys = ("audio_token_id", "boa_token_id", "eoa_token_id")
    return graph, gemma4_media_kind("audio", keys, graph.encode, MAX_CLIPS, text, config, label)
