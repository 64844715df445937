"""Audio given to ``run`` or in chat messages: one mono waveform of float samples at the model's sampling rate, checked.

Accepted: a 1-D float array (samples in [-1, 1]) or int16 array at the model's rate;
``{"raw" | "array": samples, "sampling_rate": n}`` as transformers' pipeline takes it; or a WAV
file (a path or its bytes: PCM 8/16/24/32-bit integers, any number of channels, averaged to mono).
Nothing is resampled: audio at another rate is ``BAD_REQUEST`` naming both rates, as is an empty
or non-finite waveform, another container (MP3, FLAC…) or audio longer than ``max_seconds``.
"""

from __future__ import annotations

import io
import wave
from pathlib import Path
from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode, read_media_file


def _bad(message: str, cause: BaseException | None = None) -> AnyformerError:
    return AnyformerError(ErrorCode.BAD_REQUEST, message, cause=cause)


def _samples(value: Any, what: str) -> np.ndarray:
    array = np.asarray(value)
    if array.ndim == 2 and 1 in array.shape:
        array = array.reshape(-1)
    if array.ndim != 1:
        raise _bad(f"{what} is an array of shape {array.shape}; send one mono waveform (1-D)")
    if array.dtype == np.int16:
        return array.astype(np.float32) / 32768.0
    if array.dtype.kind != "f":
        raise _bad(f"{what} is an array of {array.dtype}; send float samples in [-1, 1] (or int16)")
    return array.astype(np.float32)


def decode_wav(data: bytes, what: str = "the audio") -> tuple[np.ndarray, int]:
    """Mono float32 samples and the sampling rate of a PCM WAV file; ``BAD_REQUEST`` for anything else."""
    if not (data[:4] == b"RIFF" and data[8:12] == b"WAVE"):
        raise _bad(f"{what} is not a WAV file (RIFF/WAVE); other containers (MP3, FLAC, OGG) are not decoded")
    try:
        with wave.open(io.BytesIO(data)) as reader:
            channels, width, rate = reader.getnchannels(), reader.getsampwidth(), reader.getframerate()
            frames = reader.readframes(reader.getnframes())
    except (wave.Error, EOFError, ValueError) as exc:
        raise _bad(f"{what}: not a PCM WAV file this backend reads ({exc})", exc) from None
    if channels < 1 or width not in (1, 2, 3, 4):
        raise _bad(f"{what}: {channels} channels of {8 * width}-bit samples; 8/16/24/32-bit PCM is read")
    usable = len(frames) - len(frames) % (channels * width)
    raw = np.frombuffer(frames[:usable], dtype=np.uint8)
    if width == 1:  # unsigned, centred on 128
        samples = (raw.astype(np.float32) - 128.0) / 128.0
    elif width == 3:  # little-endian 24-bit: widen to 32 bits, keeping the sign
        triples = raw.reshape(-1, 3).astype(np.int32)
        packed = (triples[:, 0] << 8) | (triples[:, 1] << 16) | (triples[:, 2] << 24)
        samples = packed.astype(np.float32) / 2.0**31
    else:
        dtype = np.dtype("<i2") if width == 2 else np.dtype("<i4")
        samples = raw.view(dtype).astype(np.float32) / float(2 ** (8 * width - 1))
    return samples.reshape(-1, channels).mean(axis=1).astype(np.float32), rate


#: Why a clip is too long, for ``run`` on a speech model.
TRANSCRIBED = "are transcribed in one call (the max_duration_s option)"
#: Why a clip is too long, for an audio block of a chat message (its encoder's window).
IN_CHAT_WINDOW = "fit the model's audio window (cut the clip, or send it as several audio blocks)"


def load_audio(
    value: Any, rate: int, max_seconds: float, what: str = "the audio", limit: str = TRANSCRIBED
) -> np.ndarray:
    """Mono float32 samples at ``rate`` from any accepted form (module docstring); ``BAD_REQUEST`` otherwise.

    ``limit`` ends the message for a clip over ``max_seconds`` ("at most N s <limit>").
    """
    given: int | None = None
    if isinstance(value, dict):
        samples = value.get("raw", value.get("array"))
        given = value.get("sampling_rate")
        if samples is None or isinstance(given, bool) or not isinstance(given, int):
            raise _bad(f"{what}: a dict needs 'raw' (or 'array') samples and an integer 'sampling_rate'")
        audio = _samples(samples, what)
    elif isinstance(value, str) and value.startswith(("http://", "https://")):
        raise _bad(f"{what}: URLs are not fetched; pass a path, the file's bytes or an array")
    elif isinstance(value, (str, Path)):
        audio, given = decode_wav(read_media_file(value, what, "audio"), what)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        audio, given = decode_wav(bytes(value), what)
    elif isinstance(value, (np.ndarray, list)):
        audio = _samples(value, what)
    else:
        raise _bad(f"{what} is a {type(value).__name__}; send a WAV path or bytes, an array, or a dict")
    if given is not None and given != rate:
        raise _bad(f"{what} is sampled at {given} Hz; this model takes {rate} Hz (resample it first)")
    if audio.size == 0:
        raise _bad(f"{what} has no samples")
    if not np.isfinite(audio).all():
        raise _bad(f"{what} has NaN or infinite samples")
    if audio.size > max_seconds * rate:
        raise _bad(f"{what} lasts {audio.size / rate:.1f} s; at most {max_seconds:g} s {limit}")
    return audio
