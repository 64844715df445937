"""An encoder ONNX graph loaded for embeddings: ``run`` returns pooled, unit-length vectors.

The pooling is the model's own (sentence-transformers' ``1_Pooling/config.json``: mean, CLS or
max over the tokens), mean when it names none; padding is masked out, so a text's vector does not
depend on the batch it came in. The handle declares ``run_progress``: an ``embed`` event after each
batch (``done`` of ``total`` texts), where a cancelled run stops.
"""

from __future__ import annotations

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
from anyformer_onnx.tasks.names import SENTENCE_SIMILARITY
from anyformer_onnx.text.encoder import EncoderGraph, texts_of

POOLINGS = ("mean", "cls", "max")
_HIDDEN_OUTPUTS = ("last_hidden_state", "token_embeddings")


def pooling_of(config: dict[str, Any]) -> str:
    """The pooling sentence-transformers' ``1_Pooling/config.json`` asks for (``mean`` when it says nothing)."""
    if config.get("pooling_mode_cls_token"):
        return "cls"
    if config.get("pooling_mode_max_tokens"):
        return "max"
    return "mean"


def pool(hidden: np.ndarray, mask: np.ndarray, how: str) -> np.ndarray:
    """Pool ``hidden`` [batch, tokens, width] over the tokens ``mask`` marks."""
    weights = mask[:, :, None].astype(np.float32)
    if how == "cls":
        return hidden[:, 0, :].astype(np.float32)
    if how == "max":
        return np.where(weights > 0, hidden, -np.inf).max(axis=1).astype(np.float32)
    summed = (hidden.astype(np.float32) * weights).sum(axis=1)
    return summed / np.clip(weights.sum(axis=1), 1e-9, None)


class OnnxEmbeddingModel(BackendModel):
    """A loaded encoder graph with its tokenizer, for ``feature-extraction`` and ``sentence-similarity``."""

    backend = BACKEND_ID
    #: ``run`` reports each batch embedded and stops between batches when cancelled (the core's contract).
    features = Features(run_progress=True)

    def __init__(self, encoder: EncoderGraph, *, task: str, pooling: str, details: dict[str, Any]) -> None:
        self.task = task
        self.encoder = encoder
        self.pooling = pooling
        self.details = details
        self._output = next((name for name in _HIDDEN_OUTPUTS if name in encoder.outputs), encoder.outputs[0])

    def dispose(self) -> None:
        """Drop the session; safe to call twice."""
        self.encoder.close()

    def embed(
        self,
        texts: list[str],
        *,
        normalize: bool = True,
        pooling: str | None = None,
        progress: ProgressCallback = no_progress,
    ) -> tuple[np.ndarray, int]:
        """Vectors [len(texts), width] for ``texts`` and the number of tokens read; ``progress`` after each batch."""
        how = pooling or self.pooling
        if how not in POOLINGS:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"pooling must be one of {', '.join(POOLINGS)}, got {how!r}")
        vectors = []
        tokens = 0
        for _, mask, hidden in self.encoder.batches(texts, self._output):
            # A 2-D output is a graph that pools itself (a sentence_embedding output).
            vectors.append(hidden.astype(np.float32) if hidden.ndim == 2 else pool(hidden, mask, how))
            tokens += int(mask.sum())
            done = sum(len(v) for v in vectors)
            progress(ProgressEvent(stage="embed", backend=self.backend, done=done, total=len(texts), message="texts"))
        matrix = np.concatenate(vectors)
        if normalize:
            matrix = matrix / np.clip(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12, None)
        return matrix, tokens

    def run(
        self,
        input: Any,
        *,
        normalize: bool = True,
        pooling: str | None = None,
        progress: ProgressCallback = no_progress,
        **options: Any,
    ) -> Any:
        """Embed texts, or score sentences against a source sentence.

        ``progress`` (the core's reporter) gets an event after each batch; it raises ``CANCELLED`` when
        the caller cancelled, which ends the call with no result.

        ``feature-extraction``: a text or a list of texts → ``{"embeddings": [vector, ...], "tokens": n}``.
        ``sentence-similarity``: ``{"source_sentence": text, "sentences": [text, ...]}`` → the cosine
        similarity of each sentence to the source, a list of floats (a plain text or list embeds, as above).
        """
        if options:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"unknown option {sorted(options)[0]!r} for {self.task}")
        if not isinstance(normalize, bool):
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"normalize must be True or False, got {normalize!r}")
        if self.task == SENTENCE_SIMILARITY and isinstance(input, dict):
            source, sentences = input.get("source_sentence"), input.get("sentences")
            if not isinstance(source, str):
                raise AnyformerError(ErrorCode.BAD_REQUEST, "sentence-similarity needs a string 'source_sentence'")
            others, _ = texts_of(sentences, self.task)
            matrix, _ = self.embed([source, *others], normalize=True, pooling=pooling, progress=progress)
            return [float(x) for x in matrix[1:] @ matrix[0]]
        texts, _ = texts_of(input, self.task)
        matrix, tokens = self.embed(texts, normalize=normalize, pooling=pooling, progress=progress)
        return {"embeddings": matrix.tolist(), "tokens": tokens}
