"""An encoder graph (BERT-like: token ids in, one vector per token or per text out) with its tokenizer.

Shared by the embedding and classification handles: texts are checked, tokenized in batches padded
to the longest text of the batch, and fed as ``input_ids``, ``attention_mask`` and
``token_type_ids`` (each when the graph takes it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from anyformer.plugin import AnyformerError, ErrorCode

#: Texts per onnxruntime call: padding to the longest of a batch costs little at this size.
BATCH = 32
#: The most texts one call takes: a list this long is a mistake, not a request.
MAX_TEXTS = 100_000
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def texts_of(value: Any, task: str) -> tuple[list[str], bool]:
    """The texts of a ``run`` input and whether it was a single string; ``BAD_REQUEST`` otherwise."""
    single = isinstance(value, str)
    texts = [value] if single else value
    if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) for t in texts):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{task} takes a string or a non-empty list of strings")
    if len(texts) > MAX_TEXTS:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{len(texts)} texts in one call; at most {MAX_TEXTS}")
    return list(texts), single


class EncoderGraph:
    """A session whose inputs are a subset of ``input_ids``/``attention_mask``/``token_type_ids``."""

    def __init__(self, session: Any, tokenizer: Any, label: str) -> None:
        inputs = {i.name for i in session.get_inputs()}
        unknown = sorted(inputs - set(_INPUTS))
        if "input_ids" not in inputs or unknown:
            wanted = unknown[0] if unknown else "input_ids"
            raise AnyformerError(ErrorCode.BAD_MODEL, f"{label}: not an encoder graph this backend feeds ({wanted})")
        self.session: Any = session
        self.tokenizer = tokenizer
        self.label = label
        self.inputs = inputs
        self.outputs = [o.name for o in session.get_outputs()]
        # tokenizer.json may pad every input to a fixed length (all-MiniLM-L6-v2 pads to 128): pad to
        # the longest text of a batch instead, with the tokenizer's own pad token.
        padding = tokenizer.padding or {}
        tokenizer.enable_padding(pad_id=padding.get("pad_id", 0), pad_token=padding.get("pad_token", "[PAD]"))

    def close(self) -> None:
        """Drop the session; later calls are ``BAD_REQUEST``."""
        self.session = None

    def batches(self, texts: Sequence[str], output: str) -> Iterator[tuple[list[Any], np.ndarray, np.ndarray]]:
        """For each batch: its encodings, its attention mask and the graph's ``output`` for it."""
        if self.session is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.label} was disposed")
        for start in range(0, len(texts), BATCH):
            encodings = self.tokenizer.encode_batch(list(texts[start : start + BATCH]))
            mask = np.asarray([e.attention_mask for e in encodings], dtype=np.int64)
            feeds = {"input_ids": np.asarray([e.ids for e in encodings], dtype=np.int64)}
            if "attention_mask" in self.inputs:
                feeds["attention_mask"] = mask
            if "token_type_ids" in self.inputs:
                feeds["token_type_ids"] = np.asarray([e.type_ids for e in encodings], dtype=np.int64)
            (result,) = self.session.run([output], feeds)
            yield encodings, mask, result
