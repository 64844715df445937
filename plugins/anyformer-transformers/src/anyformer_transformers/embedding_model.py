"""An encoder loaded for embeddings: ``run`` returns pooled, unit-length vectors, shaped as the ONNX backend's.

The pooling is the model's own (sentence-transformers' ``1_Pooling/config.json``: mean, CLS or
max over the tokens), mean when it names none; padding is masked out, so a text's vector does not
depend on the batch it came in. The handle declares ``run_progress``: an ``embed`` event after each
batch (``done`` of ``total`` texts), where a cancelled run stops.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from anyformer.plugin import AnyformerError, ErrorCode, ProgressCallback, ProgressEvent, no_progress
from anyformer_transformers import BACKEND_ID
from anyformer_transformers.encoder import Encoder, texts_of
from anyformer_transformers.tasks import SENTENCE_SIMILARITY

POOLINGS = ("mean", "cls", "max")


def pooling_of(config: Mapping[str, Any]) -> str:
    """The pooling sentence-transformers' ``1_Pooling/config.json`` asks for (``mean`` when it says nothing)."""
    if config.get("pooling_mode_cls_token"):
        return "cls"
    if config.get("pooling_mode_max_tokens"):
        return "max"
    return "mean"


def pool(hidden: Any, mask: Any, how: str) -> Any:
    """Pool ``hidden`` [batch, tokens, width] over the tokens ``mask`` marks, in float32."""
    import torch

    hidden = hidden.float()
    if how == "cls":
        return hidden[:, 0, :]
    weights = mask[:, :, None].to(hidden.dtype)
    if how == "max":
        return hidden.masked_fill(weights == 0, float("-inf")).amax(dim=1)
    return (hidden * weights).sum(dim=1) / torch.clamp(weights.sum(dim=1), min=1e-9)


class EmbeddingModel:
    """A loaded encoder with its tokenizer, for ``feature-extraction`` and ``sentence-similarity``."""

    backend = BACKEND_ID
    #: ``run`` reports each batch embedded and stops between batches when cancelled (the core's contract).
    run_progress = True

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
