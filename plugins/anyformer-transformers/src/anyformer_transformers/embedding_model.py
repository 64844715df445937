"""An encoder loaded for embeddings: ``run`` returns pooled, unit-length vectors, shaped as the ONNX backend's.

The pooling is the model's own (sentence-transformers' ``1_Pooling/config.json``: mean, CLS, max,
mean over √length, or the last token, as decoder embedders such as Qwen3-Embedding use), mean when
it names none; a mode it cannot apply is ``BAD_MODEL`` at load, never a silently different vector.
Padding is masked out, so a text's vector does not depend on the batch it came in. The handle
declares ``run_progress``: an ``embed`` event after each batch (``done`` of ``total`` texts), where a
cancelled run stops.
"""

from __future__ import annotations

from collections.abc import Mapping
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
from anyformer_transformers.tasks import SENTENCE_SIMILARITY

POOLINGS = ("mean", "cls", "max", "mean_sqrt_len", "lasttoken")
#: ``1_Pooling/config.json``'s keys and the pooling each turns on.
_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_lasttoken": "lasttoken",
}


def pooling_of(config: Mapping[str, Any], label: str) -> str:
    """The pooling sentence-transformers' ``1_Pooling/config.json`` asks for (``mean`` when it says nothing).

    ``BAD_MODEL`` for a mode this backend does not apply (weighted mean) or several at once
    (sentence-transformers concatenates them), so that no vector differs from the model's own.
    """
    on = [key for key, value in config.items() if key.startswith("pooling_mode_") and value is True]
    unknown = [key for key in on if key not in _MODES]
    if unknown or len(on) > 1:
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"{label}: pooling {', '.join(on)} is not one this backend applies ({POOLINGS})"
        )
    return _MODES[on[0]] if on else "mean"


def pool(hidden: Any, mask: Any, how: str) -> Any:
    """Pool ``hidden`` [batch, tokens, width] over the tokens ``mask`` marks, in float32."""
    import torch

    hidden = hidden.float()
    if how == "cls":
        return hidden[:, 0, :]
    if how == "lasttoken":  # batches are padded on the right: the last real token is at length - 1
        return hidden[torch.arange(hidden.shape[0]), mask.sum(dim=1) - 1]
    weights = mask[:, :, None].to(hidden.dtype)
    if how == "max":
        return hidden.masked_fill(weights == 0, float("-inf")).amax(dim=1)
    summed = (hidden * weights).sum(dim=1)
    count = torch.clamp(weights.sum(dim=1), min=1e-9)
    return summed / (count.sqrt() if how == "mean_sqrt_len" else count)


class EmbeddingModel(BackendModel):
    """A loaded encoder with its tokenizer, for ``feature-extraction`` and ``sentence-similarity``."""

    backend = BACKEND_ID
    #: ``run`` reports each batch embedded and stops between batches when cancelled (the core's contract).
    features = Features(run_progress=True)

    def __init__(self, encoder: Encoder, *, task: str, pooling: str, details: dict[str, Any]) -> None:
        self.task = task
        self.encoder = encoder
        self.pooling = pooling
        #: What was loaded: class, dtype, device, pooling (``anyformer run --verbose`` shows it).
        self.details = details

    def dispose(self) -> None:
        """Drop the network; safe to call twice."""
        self.encoder.close()

    def embed(
        self,
        texts: list[str],
        *,
        normalize: bool = True,
        pooling: str | None = None,
        progress: ProgressCallback = no_progress,
    ) -> tuple[Any, int]:
        """Vectors [len(texts), width] (float32) and the number of tokens read; ``progress`` after each batch."""
        import torch

        how = pooling or self.pooling
        if how not in POOLINGS:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"pooling must be one of {', '.join(POOLINGS)}, got {how!r}")
        vectors = []
        tokens = 0
        done = 0
        for _, mask, output in self.encoder.batches(texts):
            vectors.append(pool(output.last_hidden_state, mask, how))
            tokens += int(mask.sum())
            done += len(mask)
            progress(ProgressEvent(stage="embed", backend=self.backend, done=done, total=len(texts), message="texts"))
        matrix = torch.cat(vectors)
        if normalize:
            matrix = matrix / torch.clamp(torch.linalg.vector_norm(matrix, dim=1, keepdim=True), min=1e-12)
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
