"""An encoder network (BERT-like: token ids in, one vector per token out) with its fast tokenizer.

Shared by the embedding and classification handles: texts are checked, tokenized with the repo's
``tokenizer.json`` (the ``tokenizers`` library, as the ONNX backend does) and cut at the model's
limit, grouped in order into batches of at most ``BATCH`` texts and ``BATCH_TOKENS`` padded tokens
(the memory ``can_run`` counted), padded to the longest text of the batch, and fed as
``input_ids``, ``attention_mask`` and ``token_type_ids`` (the last when the network takes it).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from typing import Any

from anyformer.plugin import AnyformerError, ErrorCode
from anyformer_transformers.estimate import ENCODER_BATCH, ENCODER_BATCH_TOKENS

#: Texts per forward pass at most: padding to the longest of a batch costs little at this size.
BATCH = ENCODER_BATCH
#: Padded tokens per forward pass at most (a longer text runs alone).
BATCH_TOKENS = ENCODER_BATCH_TOKENS
#: The most texts one call takes: a list this long is a mistake, not a request.
MAX_TEXTS = 100_000


def texts_of(value: Any, task: str) -> tuple[list[str], bool]:
    """The texts of a ``run`` input and whether it was a single string; ``BAD_REQUEST`` otherwise."""
    single = isinstance(value, str)
    texts = [value] if single else value
    if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) for t in texts):
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{task} takes a string or a non-empty list of strings")
    if len(texts) > MAX_TEXTS:
        raise AnyformerError(ErrorCode.BAD_REQUEST, f"{len(texts)} texts in one call; at most {MAX_TEXTS}")
    return list(texts), single


class Encoder:
    """A torch network and the tokenizer that feeds it; ``batches`` runs texts through it."""

    def __init__(self, network: Any, tokenizer: Any, *, max_tokens: int, pad_id: int, label: str) -> None:
        self.network: Any = network
        self.tokenizer = tokenizer
        self.label = label
        self.max_tokens = max_tokens
        self._type_ids = "token_type_ids" in inspect.signature(network.forward).parameters
        # tokenizer.json may pad every input to a fixed length (all-MiniLM-L6-v2 pads to 128): each
        # batch is padded here to its longest text instead; and never past the positions the model has.
        padding = tokenizer.padding or {}
        self._pad = {"pad_id": padding.get("pad_id", pad_id), "pad_token": padding.get("pad_token", "[PAD]")}
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=max_tokens)

    def close(self) -> None:
        """Drop the network (torch frees its tensors with the last reference); later calls are ``BAD_REQUEST``."""
        self.network = None

    def batches(self, texts: Sequence[str]) -> Iterator[tuple[list[Any], Any, Any]]:
        """For each batch: its encodings, its attention mask and the network's output, as torch tensors."""
        import torch

        network = self.network
        if network is None:
            raise AnyformerError(ErrorCode.BAD_REQUEST, f"{self.label} was disposed; load it again")
        for encodings in _groups(self.tokenizer.encode_batch(list(texts))):
            longest = max(len(e.ids) for e in encodings)
            for encoding in encodings:
                encoding.pad(longest, **self._pad)
            mask = torch.tensor([e.attention_mask for e in encodings], dtype=torch.long)
            feeds = {"input_ids": torch.tensor([e.ids for e in encodings], dtype=torch.long), "attention_mask": mask}
            if self._type_ids:
                feeds["token_type_ids"] = torch.tensor([e.type_ids for e in encodings], dtype=torch.long)
            device = network.device
            with torch.inference_mode():
                output = network(**{name: value.to(device) for name, value in feeds.items()})
            if device.type != "cpu":  # the pooling and labels read host tensors, beside the host mask
                output = type(output)(**{k: v.cpu() if hasattr(v, "cpu") else v for k, v in output.items()})
            yield encodings, mask, output


def _groups(encodings: list[Any]) -> Iterator[list[Any]]:
    """``encodings`` in order, in groups of at most ``BATCH`` whose padded size stays within ``BATCH_TOKENS``."""
    group: list[Any] = []
    longest = 0
    for encoding in encodings:
        size = len(encoding.ids)
        if group and (len(group) == BATCH or (len(group) + 1) * max(longest, size) > BATCH_TOKENS):
            yield group
            group, longest = [], 0
        group.append(encoding)
        longest = max(longest, size)
    if group:
        yield group
