"""automatic-speech-recognition with a Whisper-style encoder-decoder export: greedy decoding with past keys and values.

The layout is optimum's split export: ``encoder_model.onnx`` (``input_features`` → ``last_hidden_state``),
``decoder_model.onnx`` (``input_ids``, ``encoder_hidden_states`` → ``logits``,
``present.N.decoder.key/value``, ``present.N.encoder.key/value``) for the prompt, and
``decoder_with_past_model.onnx`` (``input_ids``, ``past_key_values.N.{decoder,encoder}.key/value``
→ ``logits``, ``present.N.decoder.key/value``) for each later token. The cache stays in
onnxruntime's OrtValues from step to step (``run_with_ort_values``), never copied through numpy;
the cross-attention keys and values are computed once, by the first step.

The prompt is ``generation_config.json``'s: the start token; on a multilingual model the language
(the ``language`` option, else detected as transformers does: the likeliest language token after
the start token) and the task (``transcribe`` or ``translate``); then ``<|notimestamps|>`` unless
timestamps are asked for. Each step suppresses ``suppress_tokens``, the first also
``begin_suppress_tokens``, and with timestamps Whisper's timestamp rules apply
(:func:`~anyformer_onnx.speech.longform.timestamp_rules`); a reply ends at ``eos_token_id`` or after
``max_new_tokens`` (default: ``max_length`` less the prompt).

As transformers' pipeline with ``chunk_length_s=30``: a clip is cut into windows of 30 s overlapping
by 5 s on each inner side; each window is decoded as Whisper's ``generate`` decodes one (resuming
after the last pair of timestamps until the window's end) and the windows' tokens are merged where
they overlap into the text and, with ``return_timestamps=True``, segments
``{"text", "timestamp": (start, end)}`` (:mod:`anyformer_onnx.speech.longform`).

The handle declares ``run_progress``: ``run`` reports a ``transcribe`` (or ``translate``) event after
each window, ``done`` of ``total`` windows over every clip of the call (a clip of 30 s or less is
one window), and the core's reporter raises ``CANCELLED`` there once the caller cancelled, so a long
transcription stops between two windows and returns nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from anyformer.plugin import (
    AnyformerError,
    BackendModel,
    ErrorCode,
    Features,
    ProgressCallback,
    ProgressEvent,
    no_progress,
)
from anyformer_onnx import BACKEND_ID
from anyformer_onnx.media.audio_input import load_audio
from anyformer_onnx.media.log_mel import LogMel
from anyformer_onnx.speech.longform import chunk_spans, merge_windows, split_segments, timestamp_rules

_PAST = re.compile(r"^past_key_values\.(\d+)\.(decoder|encoder)\.(key|value)$")
#: The most clips one call takes.
MAX_CLIPS = 64
TASKS = ("transcribe", "translate")
#: The longest audio one call transcribes unless ``max_duration_s`` says otherwise, and the most it may say.
DEFAULT_MAX_SECONDS = 1800.0
MAX_SECONDS_CEILING = 4 * 3600.0


def _int_ids(value: Any) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _single_id(generation: Mapping[str, Any], key: str, label: str) -> int:
    ids = _int_ids(generation.get(key))
    if not ids:
        raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: generation_config.json names no {key}")
    return ids[0]


class WhisperGraphs:
    """The three sessions of a split export, their names checked."""

    def __init__(self, encoder: Any, first: Any, with_past: Any, label: str) -> None:
        def names(session: Any, which: str) -> list[str]:
            return [item.name for item in getattr(session, f"get_{which}")()]

        if names(encoder, "inputs") != ["input_features"]:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: the encoder graph does not take input_features alone")
        first_inputs = set(names(first, "inputs"))
        if first_inputs != {"input_ids", "encoder_hidden_states"}:
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"{label}: decoder_model takes {sorted(first_inputs)}, not input_ids and states"
            )
        self.past_names = [name for name in names(with_past, "inputs") if _PAST.match(name)]
        unknown = set(names(with_past, "inputs")) - {"input_ids", *self.past_names}
        if unknown or not self.past_names:
            raise AnyformerError(
                ErrorCode.BAD_MODEL,
                f"{label}: decoder_with_past_model has inputs {sorted(unknown) or 'without a past'}",
            )
        self.first_outputs = names(first, "outputs")
        wanted = {name.replace("past_key_values", "present") for name in self.past_names}
        if "logits" not in self.first_outputs or not wanted <= set(self.first_outputs):
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: decoder_model lacks logits or a present output")
        #: Outputs of the with-past graph that become the next step's past (the decoder's own keys and values).
        self.own = [name for name in self.past_names if ".decoder." in name]
        missing = [n for n in self.own if n.replace("past_key_values", "present") not in names(with_past, "outputs")]
        if missing:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: decoder_with_past_model lacks {missing[0]}")
        self.encoder, self.first, self.with_past = encoder, first, with_past
        self.frames = encoder.get_inputs()[0].shape[2]
        self.label = label

    def close(self) -> None:
        """Drop the sessions."""
        self.encoder = self.first = self.with_past = None


class OnnxSpeechRecognizerModel(BackendModel):
    """A loaded Whisper-style model: the log-mel front end, three graphs, the tokenizer and the prompt rules."""

    backend = BACKEND_ID
    task = "automatic-speech-recognition"
    #: ``run`` reports each window decoded and stops between windows when cancelled (the core's contract).
    features = Features(run_progress=True)

    def __init__(
        self,
        graphs: WhisperGraphs,
        *,
        front_end: LogMel,
        tokenizer: Any,
        generation: Mapping[str, Any],
        details: dict[str, Any],
    ) -> None:
        label = graphs.label
        self.graphs = graphs
        self.front_end = front_end
        self.tokenizer = tokenizer
        self.details = details
        self.start = _single_id(generation, "decoder_start_token_id", label)
        self.eos = set(_int_ids(generation.get("eos_token_id")))
        if not self.eos:
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: generation_config.json names no eos_token_id")
        self.suppress = _int_ids(generation.get("suppress_tokens"))
        self.begin_suppress = _int_ids(generation.get("begin_suppress_tokens"))
        languages = generation.get("lang_to_id")
        self.languages = (
            {str(k): v for k, v in languages.items() if isinstance(v, int)} if isinstance(languages, Mapping) else {}
        )
        tasks = generation.get("task_to_id")
        self.tasks = {str(k): v for k, v in tasks.items() if isinstance(v, int)} if isinstance(tasks, Mapping) else {}
        no_timestamps = _int_ids(generation.get("no_timestamps_token_id"))
        self.no_timestamps = no_timestamps[0] if no_timestamps else None
        #: The first timestamp token (``<|0.00|>``): right after ``<|notimestamps|>`` in Whisper's vocabularies.
        self.timestamp_begin = self.no_timestamps + 1 if self.no_timestamps is not None else None
        initial = generation.get("max_initial_timestamp_index")
        self.max_initial = initial if isinstance(initial, int) and not isinstance(initial, bool) else None
        self.eos_first = _int_ids(generation.get("eos_token_id"))[0]
        added = tokenizer.get_added_tokens_decoder() if hasattr(tokenizer, "get_added_tokens_decoder") else {}
        limit = self.timestamp_begin if self.timestamp_begin is not None else float("inf")
        self.special = {int(i) for i, token in added.items() if getattr(token, "special", False) and i < limit}
        vocabulary = tokenizer.get_vocab_size(with_added_tokens=True) if hasattr(tokenizer, "get_vocab_size") else 0
        self.has_timestamps = self.timestamp_begin is not None and vocabulary > self.timestamp_begin
        max_length = generation.get("max_length")
        self.max_length = max_length if isinstance(max_length, int) and max_length > 0 else 448
        if front_end.samples // front_end.hop != graphs.frames and isinstance(graphs.frames, int):
            raise AnyformerError(
                ErrorCode.BAD_MODEL,
                f"{label}: the encoder takes {graphs.frames} frames; preprocessor_config.json makes "
                f"{front_end.samples // front_end.hop}",
            )

    def dispose(self) -> None:
        """Drop the sessions; safe to call twice."""
        self.graphs.close()

    # ---- the prompt --------------------------------------------------------------------------------

    def _language_id(self, language: Any) -> int | None:
        if language is None:
            return None
        if not isinstance(language, str):
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"language must be a string such as 'en', got {language!r}")
        token = language if language.startswith("<|") else f"<|{language.lower()}|>"
        if token not in self.languages:
            known = ", ".join(sorted(t.strip("<|>") for t in self.languages)) or "none (an English-only model)"
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"language {language!r} is not one of this model's: {known}")
        return self.languages[token]

    def prompt(self, states: Any, language: Any, task: Any, timestamps: bool = False) -> list[int]:
        """The decoder's prompt for one window (see the module docstring); detects the language when needed."""
        if task not in TASKS:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"task must be one of {TASKS}, got {task!r}")
        chosen = self._language_id(language)
        ids = [self.start]
        if self.languages:
            if chosen is None:
                logits, _ = self._first_step(states, ids)
                chosen = max(self.languages.values(), key=lambda i: float(logits[i]))
            ids.append(chosen)
            if task in self.tasks:
                ids.append(self.tasks[task])
        elif task != "transcribe":
            raise AnyformerError(ErrorCode.BAD_REQUEST, "this model only transcribes (it has no task tokens)")
        if self.no_timestamps is not None and not timestamps:
            ids.append(self.no_timestamps)
        return ids

    # ---- the decode loop ---------------------------------------------------------------------------

    def _first_step(self, states: Any, ids: list[int]) -> tuple[np.ndarray, dict[str, Any]]:
        import onnxruntime

        feeds = {
            "input_ids": onnxruntime.OrtValue.ortvalue_from_numpy(np.asarray([ids], dtype=np.int64)),
            "encoder_hidden_states": states,
        }
        outputs = self.graphs.first.run_with_ort_values(self.graphs.first_outputs, feeds)
        by_name = dict(zip(self.graphs.first_outputs, outputs, strict=True))
        logits = by_name["logits"].numpy()[0, -1]
        past = {name: by_name[name.replace("past_key_values", "present")] for name in self.graphs.past_names}
        return logits, past

    def _pick(self, logits: np.ndarray, reply: list[int], timestamps: bool) -> int:
        scores = logits.astype(np.float32).copy()
        for token in self.suppress:
            if 0 <= token < scores.shape[0]:
                scores[token] = -np.inf
        if not reply:
            for token in self.begin_suppress:
                if 0 <= token < scores.shape[0]:
                    scores[token] = -np.inf
        if timestamps and self.timestamp_begin is not None and self.no_timestamps is not None:
            timestamp_rules(
                scores,
                reply,
                timestamp_begin=self.timestamp_begin,
                no_timestamps=self.no_timestamps,
                eos=self.eos_first,
                max_initial=self.max_initial,
            )
        return int(np.argmax(scores))

    def _encode(self, features: np.ndarray) -> Any:
        import onnxruntime

        graphs = self.graphs
        if graphs.encoder is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{graphs.label} was disposed")
        (states,) = graphs.encoder.run_with_ort_values(
            ["last_hidden_state"], {"input_features": onnxruntime.OrtValue.ortvalue_from_numpy(features[None])}
        )
        return states

    def _greedy(self, states: Any, prompt: list[int], budget: int, timestamps: bool) -> list[int]:
        """Greedy token ids after ``prompt`` (the end token left out), at most ``budget`` of them."""
        import onnxruntime

        graphs = self.graphs
        if budget <= 0:
            return []
        logits, past = self._first_step(states, prompt)
        reply: list[int] = []
        own_outputs = ["logits", *(name.replace("past_key_values", "present") for name in graphs.own)]
        while True:
            token = self._pick(logits, reply, timestamps)
            if token in self.eos:
                break
            reply.append(token)
            if len(reply) >= budget:
                break
            past["input_ids"] = onnxruntime.OrtValue.ortvalue_from_numpy(np.asarray([[token]], dtype=np.int64))
            outputs = graphs.with_past.run_with_ort_values(own_outputs, past)
            logits = outputs[0].numpy()[0, -1]
            for name, value in zip(graphs.own, outputs[1:], strict=True):
                past[name] = value
        return reply

    def decode(
        self, audio: np.ndarray, *, language: Any, task: Any, max_new_tokens: int | None, timestamps: bool = False
    ) -> tuple[list[int], float]:
        """Token ids for one window of mono samples, and the seconds one timestamp step stands for.

        As Whisper's ``generate`` does for a window: the language (when detected) and the prompt come
        from the whole window; after each reply decoding resumes at the first timestamp of its last
        pair of consecutive timestamps (:func:`split_segments`), on the features from there on padded
        with zeros, until the window's end; the replies are concatenated.
        """
        features = self.front_end(audio)
        frames = features.shape[1]
        states = self._encode(features)
        positions = int(states.shape()[1])
        stride = max(1, frames // positions) if positions else 2
        precision = self.front_end.seconds / positions if positions else 0.02
        prompt = self.prompt(states, language, task, timestamps)
        room = self.max_length - len(prompt)
        budget = room if max_new_tokens is None else min(max_new_tokens, room)
        ids: list[int] = []
        seek = 0
        while seek < frames:
            if seek:
                window = np.zeros_like(features)
                window[:, : frames - seek] = features[:, seek:]
                states = self._encode(window)
            reply = self._greedy(states, prompt, budget, timestamps)
            if self.timestamp_begin is None:
                ids.extend(reply)
                break
            kept, advance = split_segments(reply, self.timestamp_begin, stride)
            ids.extend(kept)
            # transformers would decode the same frames again when a reply's last pair starts at 0.00 (only
            # possible without the timestamp rules): the window ends there instead.
            if advance is None or advance <= 0:
                break
            seek += advance
        return ids, precision

    def _options(self, chunk_length_s: Any, stride_length_s: Any, max_duration_s: Any) -> tuple[int, int, int, float]:
        """Chunk and stride lengths in samples and the longest audio in seconds, checked."""

        def number(value: Any, name: str) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
                raise AnyformerError(ErrorCode.BAD_REQUEST, f"{name} must be a number of seconds, got {value!r}")
            return float(value)

        rate, window = self.front_end.rate, self.front_end.seconds
        chunk = window if chunk_length_s is None else number(chunk_length_s, "chunk_length_s")
        if not 0 < chunk <= window:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"chunk_length_s must be more than 0 and at most {window:g} (one window)"
            )
        if stride_length_s is None:
            strides = (chunk / 6, chunk / 6)
        elif isinstance(stride_length_s, (list, tuple)) and len(stride_length_s) == 2:
            strides = (number(stride_length_s[0], "stride_length_s"), number(stride_length_s[1], "stride_length_s"))
        else:
            strides = (number(stride_length_s, "stride_length_s"),) * 2
        chunk_samples = round(chunk * rate)
        left, right = (round(s * rate) for s in strides)
        if left < 0 or right < 0 or left + right >= chunk_samples:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, "stride_length_s must be ≥ 0 and the two strides shorter than the chunk"
            )
        longest = DEFAULT_MAX_SECONDS if max_duration_s is None else number(max_duration_s, "max_duration_s")
        if not 0 < longest <= MAX_SECONDS_CEILING:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"max_duration_s must be more than 0 and at most {MAX_SECONDS_CEILING:g}"
            )
        return chunk_samples, left, right, longest

    def transcribe(
        self,
        audio: np.ndarray,
        *,
        spans: tuple[int, int, int],
        language: Any,
        task: Any,
        max_new_tokens: int | None,
        timestamps: bool,
        window_done: Any = None,
    ) -> tuple[dict[str, Any], list[int]]:
        """One clip in overlapping windows (:func:`chunk_spans`), merged as the pipeline merges them.

        ``window_done`` is called after each window is decoded (where a cancel stops the clip).
        """
        rate = self.front_end.rate
        chunk, left, right = spans
        windows = []
        one_window: list[int] = []
        precision = 0.02
        for start, end, stride_left, stride_right in chunk_spans(audio.size, chunk, left, right):
            ids, precision = self.decode(
                audio[start:end], language=language, task=task, max_new_tokens=max_new_tokens, timestamps=timestamps
            )
            windows.append((ids, ((end - start) / rate, stride_left / rate, stride_right / rate)))
            one_window = ids
            if window_done is not None:
                window_done()
        text, segments, merged = merge_windows(
            windows,
            timestamp_begin=self.timestamp_begin if self.timestamp_begin is not None else 1 << 62,
            precision=precision,
            special=self.special,
            languages={v: k.strip("<|>") for k, v in self.languages.items()},
            timestamps=timestamps,
            decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False),
        )
        result: dict[str, Any] = {"text": text}
        if timestamps:
            result["chunks"] = segments
        return result, one_window if len(windows) == 1 else merged

    def run(
        self,
        input: Any,
        *,
        language: Any = None,
        task: Any = "transcribe",
        max_new_tokens: Any = None,
        return_timestamps: Any = False,
        return_token_ids: Any = False,
        chunk_length_s: Any = None,
        stride_length_s: Any = None,
        max_duration_s: Any = None,
        progress: ProgressCallback = no_progress,
        **rest: Any,
    ) -> Any:
        """Transcribe a clip, or a list of clips: ``{"text"}`` each (``chunks`` and ``token_ids`` when asked).

        ``progress`` (the core's reporter) gets an event after each window, ``done`` of ``total`` windows of
        the whole call; it raises ``CANCELLED`` when the caller cancelled, which ends the call with no result.
        """
        if rest:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"unknown option {sorted(rest)[0]!r} for {self.task}")
        if return_timestamps not in (False, True, None):
            raise AnyformerError(
                ErrorCode.BAD_REQUEST,
                f"return_timestamps must be True or False (segment timestamps), got {return_timestamps!r}; "
                "word timestamps are not produced",
            )
        timestamps = bool(return_timestamps)
        if timestamps and not self.has_timestamps:
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"{self.graphs.label} has no timestamp tokens: timestamps cannot be produced"
            )
        if max_new_tokens is not None and (
            isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1
        ):
            raise AnyformerError(
                ErrorCode.BAD_REQUEST, f"max_new_tokens must be an integer ≥ 1, got {max_new_tokens!r}"
            )
        chunk, left, right, longest = self._options(chunk_length_s, stride_length_s, max_duration_s)
        # A list of clips holds arrays, dicts, paths or bytes; a list of numbers is one clip's samples.
        clip_types = (list, tuple, np.ndarray, dict, str, bytes, bytearray, memoryview, Path)
        single = not (isinstance(input, list) and input and isinstance(input[0], clip_types))
        clips = [input] if single else input
        if len(clips) > MAX_CLIPS:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{len(clips)} clips in one call; at most {MAX_CLIPS}")
        audios = [
            load_audio(clip, self.front_end.rate, longest, "the audio" if single else f"clip {index}")
            for index, clip in enumerate(clips)
        ]
        if self.graphs.encoder is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.graphs.label} was disposed")
        total = sum(len(chunk_spans(audio.size, chunk, left, right)) for audio in audios)
        stage = task if task in TASKS else "transcribe"
        done = 0

        def window_done() -> None:
            nonlocal done
            done += 1
            progress(ProgressEvent(stage=stage, backend=self.backend, done=done, total=total, message="windows"))

        results = []
        for audio in audios:
            result, ids = self.transcribe(
                audio,
                spans=(chunk, left, right),
                language=language,
                task=task,
                max_new_tokens=max_new_tokens,
                timestamps=timestamps,
                window_done=window_done,
            )
            if return_token_ids:
                result["token_ids"] = ids
            results.append(result)
        return results[0] if single else results
