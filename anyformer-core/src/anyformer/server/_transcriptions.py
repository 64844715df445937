"""``POST /v1/audio/transcriptions``: OpenAI's multipart request read and checked, and its five reply formats.

The form takes ``file`` and ``model``; ``language``, ``response_format`` (``json``, ``text``,
``srt``, ``vtt``, ``verbose_json``), ``temperature`` (0 only: Whisper decodes greedily here),
``timestamp_granularities[]`` (``segment`` only) and ``keep_alive``. ``prompt``, ``stream`` and
any other field would change the reply and are not honoured, so they are refused. The file is
decoded and resampled by :mod:`anyformer._audio_decode`; the model runs its
``automatic-speech-recognition`` task through the pool, with segment timestamps for the formats
that show them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from starlette.datastructures import FormData, UploadFile
from starlette.responses import JSONResponse, PlainTextResponse, Response

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.server._errors import bad_request
from anyformer.server._keep_alive import parse_keep_alive
from anyformer.server._schemas import MAX_MODEL_CHARS

#: The task a transcription loads its model for.
SPEECH_TASK = "automatic-speech-recognition"
#: The reply formats, as OpenAI names them.
RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
#: The formats that need segment timestamps.
TIMED_FORMATS = ("srt", "vtt", "verbose_json")
_FIELDS = {"file", "model", "language", "prompt", "response_format", "temperature", "timestamp_granularities[]"}
_FIELDS |= {"stream", "keep_alive"}


@dataclasses.dataclass(frozen=True)
class TranscriptionRequest:
    """A checked transcription form: the model, the file's bytes and what the reply should be."""

    model: str
    audio: bytes
    response_format: str = "json"
    language: str | None = None
    keep_alive: float | None = None

    @property
    def options(self) -> dict[str, Any]:
        """The speech model's ``run`` options for this request."""
        options: dict[str, Any] = {}
        if self.language:
            options["language"] = self.language
        if self.response_format in TIMED_FORMATS:
            options["return_timestamps"] = True
        return options


async def parse_transcription_form(form: FormData) -> TranscriptionRequest:
    """The form as a :class:`TranscriptionRequest`; ``BAD_REQUEST`` naming the field for anything else."""
    unknown = sorted(set(form.keys()) - _FIELDS)
    if unknown:
        raise bad_request(f"'{unknown[0]}' is not a transcription field anyformer honours", unknown[0])
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise bad_request("send the audio as a multipart file field named 'file'", "file")
    model = _text(form, "model")
    if not model:
        raise bad_request("give 'model', a speech model GET /v1/models lists", "model")
    if len(model) > MAX_MODEL_CHARS:
        raise bad_request(f"'model' is {len(model):,} characters; at most {MAX_MODEL_CHARS} are read", "model")
    response_format = _text(form, "response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise bad_request(f"'response_format' must be one of {', '.join(RESPONSE_FORMATS)}", "response_format")
    if _text(form, "prompt"):
        raise bad_request("'prompt' (text to condition Whisper on) is not supported; send no prompt", "prompt")
    if _text(form, "stream") not in (None, "", "false"):
        raise bad_request("streamed transcriptions are not supported; send stream=false", "stream")
    temperature = _text(form, "temperature")
    if temperature not in (None, ""):
        try:
            value = float(temperature)
        except ValueError:
            raise bad_request("'temperature' must be a number", "temperature") from None
        if value != 0:
            raise bad_request("only temperature 0 is supported: transcriptions decode greedily", "temperature")
    for granularity in form.getlist("timestamp_granularities[]"):
        if granularity != "segment":
            raise bad_request("only segment timestamps are produced ('word' is not)", "timestamp_granularities[]")
    keep_alive = _text(form, "keep_alive")
    audio = await upload.read()
    if not audio:
        raise bad_request("the uploaded file is empty", "file")
    return TranscriptionRequest(
        model=model,
        audio=audio,
        response_format=response_format,
        language=_text(form, "language") or None,
        keep_alive=parse_keep_alive(keep_alive) if keep_alive else None,
    )


def _text(form: FormData, name: str) -> str | None:
    value = form.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(f"'{name}' must be a text field, not a file", name)
    return value.strip()


def transcription_response(request: TranscriptionRequest, result: Any, duration: float) -> Response:
    """The model's ``{"text", "chunks"}`` in the format the request asked for."""
    if not isinstance(result, dict) or not isinstance(result.get("text"), str):
        raise AnyformerError(ErrorCode.PLUGIN_ERROR, "the speech model returned no text")
    text: str = result["text"]
    if request.response_format == "json":
        return JSONResponse({"text": text})
    if request.response_format == "text":
        return PlainTextResponse(text)
    segments = _segments(result.get("chunks") or [], duration)
    if request.response_format == "srt":
        return PlainTextResponse(to_srt(segments))
    if request.response_format == "vtt":
        return PlainTextResponse(to_vtt(segments), media_type="text/vtt")
    verbose: dict[str, Any] = {"task": "transcribe", "duration": round(duration, 3), "text": text, "segments": segments}
    if request.language:
        verbose["language"] = request.language
    return JSONResponse(verbose)


def _segments(chunks: list[Any], duration: float) -> list[dict[str, Any]]:
    """The model's chunks as OpenAI's segments; an open end (the clip ran out mid-segment) is the clip's end."""
    segments = []
    for index, chunk in enumerate(chunks):
        start, end = chunk.get("timestamp", (None, None))
        start = float(start) if start is not None else 0.0
        end = float(end) if end is not None else duration
        segments.append(
            {"id": index, "seek": 0, "start": start, "end": end, "text": chunk.get("text", ""), "temperature": 0.0}
        )
    return segments


def _clock(seconds: float, separator: str) -> str:
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def to_srt(segments: list[dict[str, Any]]) -> str:
    """SubRip: numbered cues, ``HH:MM:SS,mmm --> HH:MM:SS,mmm``, a blank line after each."""
    cues = [
        f"{n}\n{_clock(s['start'], ',')} --> {_clock(s['end'], ',')}\n{s['text'].strip()}\n"
        for n, s in enumerate(segments, 1)
    ]
    return "\n".join(cues)


def to_vtt(segments: list[dict[str, Any]]) -> str:
    """WebVTT: the ``WEBVTT`` header, then cues with ``HH:MM:SS.mmm`` times."""
    cues = [f"{_clock(s['start'], '.')} --> {_clock(s['end'], '.')}\n{s['text'].strip()}\n" for s in segments]
    return "WEBVTT\n\n" + "\n".join(cues)
