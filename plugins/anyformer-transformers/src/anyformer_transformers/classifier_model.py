"""An encoder with a classification head: ``text-classification`` and ``token-classification``.

Outputs are shaped as the ONNX backend's handles return them, which are transformers' pipelines'
shapes, so code written against ``transformers.pipeline(task)`` reads them unchanged:

- text-classification: a text gives ``[{"label", "score"}]`` (the best label), a list of texts a
  list of those dicts; ``top_k=None`` gives every label, best first, per text (``top_k=n`` the n
  best). Scores are a softmax over the labels, or a sigmoid for a multi-label or one-label head
  (``function_to_apply`` overrides: ``softmax``, ``sigmoid``, ``none``).
- token-classification (no aggregation): per text, a dict for each token whose best label is not
  ignored (``ignore_labels``, default ``["O"]``): ``entity``, ``score``, ``index`` (the token's
  position), ``word`` (the token), ``start``/``end`` (character offsets in the text). Special
  tokens are skipped.

The handle declares ``run_progress``: ``run`` reports a ``classify`` (text-classification) or ``tag``
(token-classification) event after each batch of texts, ``done`` of ``total`` texts, and stops there
when the caller cancelled (the core's reporter raises ``CANCELLED``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from anyformer.plugin import (
    AnyformerError,
    BackendModel,
    ErrorCode,
    Features,
    ProgressCallback,
    ProgressEvent,
    no_progress,
)
from anyformer_transformers import BACKEND_ID
from anyformer_transformers.encoder import Encoder, texts_of
from anyformer_transformers.tasks import TEXT_CLASSIFICATION

FUNCTIONS = ("softmax", "sigmoid", "none")
_UNSET: Any = object()


def labels_of(config: Mapping[str, Any]) -> dict[int, str]:
    """config.json's ``id2label`` with integer keys (``LABEL_n`` is used where it names none)."""
    raw = config.get("id2label")
    labels: dict[int, str] = {}
    if isinstance(raw, Mapping):
        for key, value in raw.items():
            if isinstance(value, str) and str(key).lstrip("-").isdigit():
                labels[int(key)] = value
    return labels


def apply_function(logits: Any, function: str) -> Any:
    """Scores from logits [..., labels] by ``function``: ``softmax``, ``sigmoid`` or ``none`` (float64)."""
    import torch

    values = logits.double()
    if function == "softmax":
        return torch.softmax(values, dim=-1)
    if function == "sigmoid":
        return torch.sigmoid(values)
    return values


class ClassifierModel(BackendModel):
    """A loaded encoder with a classification head and its labels."""

    backend = BACKEND_ID
    #: ``run`` reports each batch and stops between batches when cancelled (the core's contract).
    features = Features(run_progress=True)

    def __init__(self, encoder: Encoder, *, task: str, config: Mapping[str, Any], details: dict[str, Any]) -> None:
        self.task = task
        self.encoder = encoder
        #: What was loaded: class, dtype, device (``anyformer run --verbose`` shows it).
        self.details = details
        self.labels = labels_of(config)
        problem = config.get("problem_type")
        single = problem == "single_label_classification"
        multi = problem == "multi_label_classification" or (len(self.labels) == 1 and not single)
        #: The default score function, as transformers' pipeline picks it.
        self.function = "sigmoid" if multi else "softmax"

    def dispose(self) -> None:
        """Drop the network; safe to call twice."""
        self.encoder.close()

    def _label(self, index: int) -> str:
        return self.labels.get(index, f"LABEL_{index}")

    def _function(self, value: Any) -> str:
        function = self.function if value is None else value
        if function not in FUNCTIONS:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"function_to_apply must be one of {FUNCTIONS}, got {value!r}")
        return str(function)

    def run(self, input: Any, *, progress: ProgressCallback = no_progress, **options: Any) -> Any:
        """Classify a text or a list of texts (the task's output shape is in the module docstring); ``progress``
        gets an event after each batch."""
        texts, single = texts_of(input, self.task)
        if self.task == TEXT_CLASSIFICATION:
            return self._classify(texts, single, progress, **options)
        return self._tag(texts, single, progress, **options)

    def _batches(self, texts: list[str], stage: str, progress: ProgressCallback) -> Iterator[tuple[list[Any], Any]]:
        """(encodings, logits) of each batch; ``progress`` hears of a batch once the caller is done with it."""
        done = 0
        for encodings, _, output in self.encoder.batches(texts):
            yield encodings, output.logits
            done += len(encodings)
            progress(ProgressEvent(stage=stage, backend=self.backend, done=done, total=len(texts), message="texts"))

    def _classify(
        self,
        texts: list[str],
        single: bool,
        progress: ProgressCallback,
        *,
        top_k: Any = _UNSET,
        function_to_apply: Any = None,
        **rest: Any,
    ) -> Any:
        if rest:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"unknown option {sorted(rest)[0]!r} for {self.task}")
        if (
            top_k is not _UNSET
            and top_k is not None
            and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1)
        ):
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"top_k must be an integer ≥ 1 or None, got {top_k!r}")
        function = self._function(function_to_apply)
        results: list[Any] = []
        for _, logits in self._batches(texts, "classify", progress):
            for row in apply_function(logits, function).tolist():
                order = sorted(range(len(row)), key=lambda i: (-row[i], i))
                ranked = [{"label": self._label(i), "score": float(row[i])} for i in order]
                if top_k is _UNSET:
                    results.append(ranked[0])
                else:
                    results.append(ranked if top_k is None else ranked[:top_k])
        if top_k is _UNSET:
            return results[:1] if single else results
        return results[0] if single else results

    def _tag(
        self,
        texts: list[str],
        single: bool,
        progress: ProgressCallback,
        *,
        ignore_labels: Sequence[str] = ("O",),
        **rest: Any,
    ) -> Any:
        if rest:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"unknown option {sorted(rest)[0]!r} for {self.task}")
        if isinstance(ignore_labels, str) or not all(isinstance(label, str) for label in ignore_labels):
            raise AnyformerError(ErrorCode.BAD_REQUEST, "ignore_labels must be a list of label names")
        ignored = set(ignore_labels)
        results: list[list[dict[str, Any]]] = []
        for encodings, logits in self._batches(texts, "tag", progress):
            for encoding, rows in zip(encodings, apply_function(logits, "softmax").tolist(), strict=True):
                entities = []
                for index, row in enumerate(rows):
                    if encoding.special_tokens_mask[index] or not encoding.attention_mask[index]:
                        continue
                    best = max(range(len(row)), key=lambda i: (row[i], -i))
                    label = self._label(best)
                    if label in ignored:
                        continue
                    start, end = encoding.offsets[index]
                    entities.append(
                        {
                            "entity": label,
                            "score": float(row[best]),
                            "index": index,
                            "word": encoding.tokens[index],
                            "start": int(start),
                            "end": int(end),
                        }
                    )
                results.append(entities)
        return results[0] if single else results
