"""An audio file as mono float32 samples at the rate a speech model takes, decoded by PyAV (FFmpeg).

Used by ``/v1/audio/transcriptions`` and ``anyformer run WHISPER clip.mp3``; the ``speech`` extra
installs PyAV and numpy. The container is named from the file's first bytes and only
these are opened: WAV, MP3, Ogg (Vorbis, Opus), WebM/Matroska, FLAC and MP4/M4A. FFmpeg is never
left to guess, so none of its playlist or concatenation formats (which open other files or URLs)
can be reached from a file.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from anyformer.contract._errors import AnyformerError, ErrorCode

if TYPE_CHECKING:
    import numpy as np

#: The rate Whisper's front end takes.
WHISPER_RATE = 16_000
#: The longest clip decoded (the ONNX Whisper's own default limit for one call).
MAX_SECONDS = 1800.0
#: The kinds of file decoded, as people name them.
ACCEPTED = "WAV, MP3, Ogg (Opus, Vorbis), WebM, FLAC, MP4/M4A"


def container_of(data: bytes) -> str | None:
    """FFmpeg's demuxer name for ``data`` by its first bytes, None when it is none of the accepted kinds."""
    head = data[:12]
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"  # WebM is Matroska
    if head[4:8] == b"ftyp":
        return "mov"  # FFmpeg's demuxer for MP4, M4A and QuickTime
    if head[:3] == b"ID3" or (len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "mp3"
    return None


def decode_audio(data: bytes, rate: int = WHISPER_RATE, max_seconds: float = MAX_SECONDS) -> np.ndarray:
    """Mono float32 samples of ``data`` resampled to ``rate``; ``BAD_REQUEST`` for anything else."""
    try:
        import av
        import numpy as np
    except ImportError:
        raise AnyformerError(
            ErrorCode.BAD_REQUEST, "decoding audio needs PyAV on the server: pip install 'anyformer[speech]'"
        ) from None
    container_format = container_of(data)
    if container_format is None:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"the file is not audio this server decodes ({ACCEPTED})")
    limit = int(max_seconds * rate)
    parts: list[np.ndarray] = []
    size = 0
    try:
        with av.open(io.BytesIO(data), mode="r", format=container_format) as container:
            stream = container.streams.audio[0] if container.streams.audio else None
            if stream is None:
                raise AnyformerError(ErrorCode.BAD_REQUEST, "the file has no audio stream")
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    parts.append(out.to_ndarray().reshape(-1))
                    size += parts[-1].size
                if size > limit:
                    raise AnyformerError(
                        ErrorCode.BAD_REQUEST, f"the audio lasts over {max_seconds:g} s; at most that is transcribed"
                    )
            for out in resampler.resample(None):  # what the resampler still holds
                parts.append(out.to_ndarray().reshape(-1))
    except AnyformerError:
        raise
    except (av.error.FFmpegError, ValueError, EOFError) as exc:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"the audio could not be decoded: {str(exc)[:200]}") from None
    samples = np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)
    if samples.size == 0:
        raise AnyformerError(ErrorCode.BAD_REQUEST, "the audio has no samples")
    return samples
