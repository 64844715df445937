"""Whisper's log-mel front end in numpy: the ``input_features`` its encoder reads.

From ``preprocessor_config.json`` (Whisper's feature extractor keys): ``feature_size`` mel bands,
``sampling_rate``, ``n_fft``, ``hop_length``, ``chunk_length`` seconds (``n_samples``). The audio is
zero-padded (or cut) to the chunk; a periodic Hann window, the STFT centred with reflected edges,
the power spectrum, Slaney-scale triangular mel filters with Slaney area normalisation from 0 Hz to
half the sampling rate, ``log10`` clamped at 1e-10, values floored at 8 below the maximum, then
``(x + 4) / 4``; the last STFT frame is dropped so a chunk gives ``n_samples / hop_length`` frames.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode

# The Slaney mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above.
_LINEAR_STEP = 200.0 / 3.0
_BREAK_HZ = 1000.0
_BREAK_MEL = _BREAK_HZ / _LINEAR_STEP
_LOG_STEP = np.log(6.4) / 27.0


def hertz_to_mel(hertz: np.ndarray | float) -> np.ndarray:
    """Frequencies in Hz on the Slaney mel scale."""
    hertz = np.asarray(hertz, dtype=np.float64)
    above = hertz >= _BREAK_HZ
    safe = np.where(above, hertz, _BREAK_HZ)
    return np.where(above, _BREAK_MEL + np.log(safe / _BREAK_HZ) / _LOG_STEP, hertz / _LINEAR_STEP)


def mel_to_hertz(mels: np.ndarray | float) -> np.ndarray:
    """The inverse of :func:`hertz_to_mel`."""
    mels = np.asarray(mels, dtype=np.float64)
    above = mels >= _BREAK_MEL
    return np.where(above, _BREAK_HZ * np.exp(_LOG_STEP * (mels - _BREAK_MEL)), mels * _LINEAR_STEP)


def mel_filters(bins: int, bands: int, rate: int) -> np.ndarray:
    """Triangular filters [bins, bands] over ``bins`` FFT frequencies from 0 to rate/2, area-normalised."""
    fft_hz = np.linspace(0.0, rate // 2, bins)
    edges = mel_to_hertz(np.linspace(hertz_to_mel(0.0), hertz_to_mel(rate / 2), bands + 2))
    lower, centre, upper = edges[:-2], edges[1:-1], edges[2:]
    rising = (fft_hz[:, None] - lower[None, :]) / (centre - lower)[None, :]
    falling = (upper[None, :] - fft_hz[:, None]) / (upper - centre)[None, :]
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    return triangles * (2.0 / (upper - lower))[None, :]


def _positive(config: Mapping[str, Any], key: str, default: int) -> int:
    value = config.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


@dataclasses.dataclass(frozen=True)
class LogMel:
    """One model's front end (see the module docstring)."""

    bands: int
    rate: int
    n_fft: int
    hop: int
    samples: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any], label: str) -> LogMel:
        """Read Whisper's feature extractor keys (its defaults where absent); ``BAD_MODEL`` for another extractor."""
        kind = config.get("feature_extractor_type")
        if kind is not None and kind != "WhisperFeatureExtractor":
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"{label}: feature extractor {kind!r}; this backend reads Whisper's"
            )
        rate = _positive(config, "sampling_rate", 16000)
        hop = _positive(config, "hop_length", 160)
        chunk = _positive(config, "chunk_length", 30)
        samples = _positive(config, "n_samples", chunk * rate)
        return cls(_positive(config, "feature_size", 80), rate, _positive(config, "n_fft", 400), hop, samples)

    @property
    def seconds(self) -> float:
        """The longest audio one window holds."""
        return self.samples / self.rate

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        """``input_features`` [bands, samples / hop] float32 for mono float32 ``audio`` at ``rate``."""
        padded = np.zeros(self.samples, dtype=np.float64)
        used = min(audio.size, self.samples)
        padded[:used] = audio[:used]
        half = self.n_fft // 2
        centred = np.pad(padded, half, mode="reflect")
        frames = 1 + (centred.size - self.n_fft) // self.hop
        starts = np.arange(frames)[:, None] * self.hop + np.arange(self.n_fft)[None, :]
        window = np.hanning(self.n_fft + 1)[:-1]  # periodic Hann
        power = np.abs(np.fft.rfft(centred[starts] * window, axis=1)) ** 2
        mel = power @ mel_filters(self.n_fft // 2 + 1, self.bands, self.rate)
        log = np.log10(np.maximum(mel, 1e-10)).T[:, :-1]
        log = np.maximum(log, log.max() - 8.0)
        return ((log + 4.0) / 4.0).astype(np.float32)
