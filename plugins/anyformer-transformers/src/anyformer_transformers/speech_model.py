"""automatic-speech-recognition with a Whisper-style encoder-decoder: the feature extractor, then ``generate``.

A clip is mono samples at the feature extractor's rate (16 kHz for Whisper): a 1-D float array
(or int16), ``{"raw" | "array": samples, "sampling_rate": n}`` as transformers' pipeline takes it
(at that rate: nothing is resampled here), or an audio file (a path or its bytes), which the core's
``decode_audio`` decodes and resamples (PyAV, the ``speech`` extra). The log-mel features are the
repo's ``WhisperFeatureExtractor``'s and the tokens Whisper's own greedy ``generate``'s (the
prompt, language detection, suppressed tokens and the end all as transformers does them), so a
clip's text is ``transformers.pipeline``'s with ``num_beams=1``: transformers 5's pipeline
searches with 5 beams by default; this backend, as the ONNX one, decodes greedily. Options:
``language``, ``task`` (``transcribe`` or ``translate``; unset, as in the pipeline, it is left to
``generate``), ``max_new_tokens``. One call takes clips of at most 30 s (one window: long-form
decoding is the ONNX backend's); a list of clips gives a list of ``{"text"}``.

The handle declares ``run_progress``: ``run`` reports a ``transcribe`` event after each clip and
stops there once the caller cancelled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anyformer.plugin import (
    AnyformerError,
    BackendModel,
    ErrorCode,
    Features,
    ProgressCallback,
    ProgressEvent,
    decode_audio,
    no_progress,
    read_media_file,
)
from anyformer_transformers import BACKEND_ID
from anyformer_transformers.tasks import SPEECH_RECOGNITION

#: The longest clip one window holds (Whisper's ``chunk_length``).
WINDOW_SECONDS = 30.0
#: The most clips one call takes.
MAX_CLIPS = 64
TASKS = ("transcribe", "translate")


def _bad(message: str) -> AnyformerError:
    return AnyformerError(ErrorCode.BAD_REQUEST, message)


def clip_samples(value: Any, rate: int, what: str = "the audio") -> Any:
    """Mono float32 samples at ``rate`` from any accepted form (module docstring); ``BAD_REQUEST`` otherwise."""
    import numpy as np

    given = rate
    if isinstance(value, dict):
        samples = value.get("raw", value.get("array"))
        given = value.get("sampling_rate")  # type: ignore[assignment]
        if samples is None or isinstance(given, bool) or not isinstance(given, int):
            raise _bad(f"{what}: a dict needs 'raw' (or 'array') samples and an integer 'sampling_rate'")
        value = samples
    elif isinstance(value, str) and value.startswith(("http://", "https://")):
        raise _bad(f"{what}: URLs are not fetched; pass a path, the file's bytes or an array")
    elif isinstance(value, (str, Path)):
        value = decode_audio(read_media_file(value, what, "audio"), rate, WINDOW_SECONDS + 1)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        value = decode_audio(bytes(value), rate, WINDOW_SECONDS + 1)
    elif not isinstance(value, (np.ndarray, list)):
        raise _bad(f"{what} is a {type(value).__name__}; send an audio file (path or bytes), an array or a dict")
    if given != rate:
        raise _bad(f"{what} is sampled at {given} Hz; this model takes {rate} Hz (resample it first)")
    array = np.asarray(value)
    if array.ndim == 2 and 1 in array.shape:
        array = array.reshape(-1)
    if array.ndim != 1:
        raise _bad(f"{what} is an array of shape {array.shape}; send one mono waveform (1-D)")
    if array.dtype == np.int16:
        array = array.astype(np.float32) / 32768.0
    elif array.dtype.kind != "f":
        raise _bad(f"{what} is an array of {array.dtype}; send float samples in [-1, 1] (or int16)")
    array = array.astype(np.float32)
    if array.size == 0:
        raise _bad(f"{what} has no samples")
    if not np.isfinite(array).all():
        raise _bad(f"{what} has NaN or infinite samples")
    if array.size > WINDOW_SECONDS * rate:
        raise _bad(
            f"{what} lasts {array.size / rate:.1f} s; this backend transcribes at most {WINDOW_SECONDS:g} s a clip "
            "(cut it, or run it on the ONNX backend, which decodes long audio)"
        )
    return array


class SpeechModel(BackendModel):
    """The handle: a Whisper network, its feature extractor and its tokenizer."""

    backend = BACKEND_ID
    task = SPEECH_RECOGNITION
    #: ``run`` reports each clip and stops between clips when cancelled (the core's contract).
    features = Features(run_progress=True)

    def __init__(self, network: Any, extractor: Any, tokenizer: Any, *, details: dict[str, Any]) -> None:
        self._network: Any = network
        self._extractor: Any = extractor
        self._tokenizer: Any = tokenizer
        self.rate = int(extractor.sampling_rate)
        generation = network.generation_config
        self._languages = dict(getattr(generation, "lang_to_id", None) or {})
        #: What was loaded: class, dtype, device.
        self.details = details

    def dispose(self) -> None:
        """Drop the network; safe to call twice."""
        self._network = None

    def _generate_options(self, language: Any, task: Any, max_new_tokens: Any) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if task is not None and task not in TASKS:
            raise _bad(f"task must be one of {TASKS}, got {task!r:.40}")
        if language is not None:
            if not isinstance(language, str) or not self._languages:
                raise _bad(
                    f"language {language!r:.40}: this model names no languages"
                    if not self._languages
                    else f"language must be a string, got {language!r:.40}"
                )
            code = language.strip("<|>").lower()
            if f"<|{code}|>" not in self._languages:
                raise _bad(
                    f"language {language!r:.40} is not one of the model's ({', '.join(sorted(self._languages))})"
                )
            options["language"] = code
        if task is not None and self._languages:  # a multilingual model: the task token is part of the prompt
            options["task"] = task
        elif task not in (None, "transcribe"):
            raise _bad("this model transcribes only (it names no task tokens)")
        if max_new_tokens is not None:
            if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
                raise _bad(f"max_new_tokens must be an integer ≥ 1, got {max_new_tokens!r:.40}")
            options["max_new_tokens"] = max_new_tokens
        return options

    def run(
        self,
        input: Any,
        *,
        language: Any = None,
        task: Any = None,
        max_new_tokens: Any = None,
        return_timestamps: Any = False,
        progress: ProgressCallback = no_progress,
        **rest: Any,
    ) -> Any:
        """Transcribe a clip, or a list of clips: ``{"text"}`` each."""
        if rest:
            raise _bad(f"unknown option {sorted(rest)[0]!r} for {self.task}")
        if return_timestamps not in (False, None):
            raise _bad(
                f"return_timestamps={return_timestamps!r:.20}: the {BACKEND_ID} backend gives the text only "
                "(the ONNX backend gives segment timestamps)"
            )
        network = self._network
        if network is None:
            raise _bad("the model was disposed; load it again")
        options = self._generate_options(language, task, max_new_tokens)
        single = not isinstance(input, (list, tuple))
        items = [input] if single else list(input)
        if not items or len(items) > MAX_CLIPS:
            raise _bad(f"{self.task} takes a clip or a list of 1 to {MAX_CLIPS} clips, got {len(items)}")
        clips = [clip_samples(item, self.rate, "the audio" if single else f"clip {i}") for i, item in enumerate(items)]
        results = []
        for done, samples in enumerate(clips, 1):
            results.append({"text": self._transcribe(network, samples, options)})
            progress(
                ProgressEvent(
                    stage=str(task or "transcribe"), backend=BACKEND_ID, done=done, total=len(clips), message="clips"
                )
            )
        return results[0] if single else results

    def _transcribe(self, network: Any, samples: Any, options: dict[str, Any]) -> str:
        import torch

        features = self._extractor(samples, sampling_rate=self.rate, return_tensors="pt", return_attention_mask=True)
        with torch.inference_mode():
            ids = network.generate(
                input_features=features.input_features.to(network.device, network.dtype),
                attention_mask=features.attention_mask.to(network.device),
                num_beams=1,
                do_sample=False,
                **options,
            )
        return str(self._tokenizer.decode(ids[0], skip_special_tokens=True))
