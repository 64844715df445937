"""An encoder ONNX graph loaded for embeddings: ``run`` returns pooled, unit-length vectors.

The pooling is the model's own (sentence-transformers' ``1_Pooling/config.json``: mean, CLS or
max over the tokens), mean when it names none; padding is masked out, so a text's vector does not
depend on the batch it came in.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_onnx import BACKEND_ID
from anyformer_onnx.tasks import SENTENCE_SIMILARITY

#: Texts per onnxruntime call: padding to the longest of a batch costs little at this size.
BATCH = 32
#: The most texts one call takes: a list this long is a mistake, not a request.
MAX_TEXTS = 100_000
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


def _texts(value: Any) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) for t in texts):
        raise AnyformerError(ErrorCode.BAD_REQUEST, "embeddings take a string or a non-empty list of strings")
    if len(texts) > MAX_TEXTS:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{len(texts)} texts in one call; at most {MAX_TEXTS}")
    return list(texts)


class OnnxEmbeddingModel:
    """A loaded encoder graph with its tokenizer, for ``feature-extraction`` and ``sentence-similarity``."""

    backend = BACKEND_ID

    def __init__(self, session: Any, tokenizer: Any, *, task: str, pooling: str, details: dict[str, Any]) -> None:
        self.task = task
        self._session: Any = session
        self._tokenizer = tokenizer
        self.pooling = pooling
        self.details = details
        inputs = {i.name for i in session.get_inputs()}
        unknown = inputs - {"input_ids", "attention_mask", "token_type_ids"}
        if "input_ids" not in inputs or unknown:
            wanted = sorted(unknown)[0] if unknown else "input_ids"
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"{details.get('file')}: not an encoder graph this backend feeds ({wanted})"
            )
        self._inputs = inputs
        outputs = [o.name for o in session.get_outputs()]
        self._output = next((name for name in _HIDDEN_OUTPUTS if name in outputs), outputs[0])
        # tokenizer.json may pad every input to a fixed length (all-MiniLM-L6-v2 pads to 128): pad to
        # the longest text of a batch instead, with the tokenizer's own pad token.
        padding = tokenizer.padding or {}
        tokenizer.enable_padding(pad_id=padding.get("pad_id", 0), pad_token=padding.get("pad_token", "[PAD]"))

    def dispose(self) -> None:
        """Drop the session; safe to call twice."""
        self._session = None

    def embed(self, texts: list[str], *, normalize: bool = True, pooling: str | None = None) -> tuple[np.ndarray, int]:
        """Vectors [len(texts), width] for ``texts`` and the number of tokens read."""
        if self._session is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.details.get('file')} was disposed")
        how = pooling or self.pooling
        if how not in POOLINGS:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"pooling must be one of {', '.join(POOLINGS)}, got {how!r}")
        vectors = []
        tokens = 0
        for start in range(0, len(texts), BATCH):
            encodings = self._tokenizer.encode_batch(texts[start : start + BATCH])
            ids = np.asarray([e.ids for e in encodings], dtype=np.int64)
            mask = np.asarray([e.attention_mask for e in encodings], dtype=np.int64)
            feeds = {"input_ids": ids}
            if "attention_mask" in self._inputs:
                feeds["attention_mask"] = mask
            if "token_type_ids" in self._inputs:
                feeds["token_type_ids"] = np.asarray([e.type_ids for e in encodings], dtype=np.int64)
            (hidden,) = self._session.run([self._output], feeds)
            if hidden.ndim == 2:  # the graph pools itself (a sentence_embedding output)
                vectors.append(hidden.astype(np.float32))
            else:
                vectors.append(pool(hidden, mask, how))
            tokens += int(mask.sum())
        matrix = np.concatenate(vectors)
        if normalize:
            matrix = matrix / np.clip(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12, None)
        return matrix, tokens

    def run(self, input: Any, *, normalize: bool = True, pooling: str | None = None, **options: Any) -> Any:
        """Embed texts, or score sentences against a source sentence.

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
            others = _texts(sentences)
            matrix, _ = self.embed([source, *others], normalize=True, pooling=pooling)
            return [float(x) for x in matrix[1:] @ matrix[0]]
        matrix, tokens = self.embed(_texts(input), normalize=normalize, pooling=pooling)
        return {"embeddings": matrix.tolist(), "tokens": tokens}
