"""Tiny random BERTs saved as a Hub repo holds them, with a WordPiece ``tokenizer.json`` built by ``tokenizers``.

One bare encoder laid out as a sentence-transformers repo (``modules.json``, mean pooling, a short
``max_seq_length``), one with a sequence-classification head, one with a token-classification
head. Each builder seeds torch and takes well under a second.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The longest text the embedding model reads (its sentence_bert_config.json), in tokens.
MAX_SEQ_LENGTH = 16
TEXT_LABELS = ["negative", "neutral", "positive"]
TOKEN_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_WORDS = "the a man is eating food cat sat on mat dog in paris sarah lives love this movie weather was awful"
_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
_PUNCTUATION = ".,!?'-"


def write_wordpiece_tokenizer(folder: Path) -> int:
    """A lower-casing WordPiece tokenizer (BERT's normaliser, pre-tokenizer and ``[CLS] … [SEP]``); its vocab size."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    pieces = [*_WORDS.split(), *_ALPHABET, *_PUNCTUATION, *(f"##{c}" for c in _ALPHABET)]
    vocab = {token: i for i, token in enumerate(dict.fromkeys(_SPECIALS + pieces))}
    tokenizer = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tokenizer.decoder = decoders.WordPiece()
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    settings = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "[UNK]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "mask_token": "[MASK]",
        "model_max_length": 64,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
    return len(vocab)


def _bert_config(vocab: int, **fields: Any) -> Any:
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        **fields,
    )


def build_embedder(folder: Path) -> Path:
    """A random bare BERT as a sentence-transformers repo: mean pooling, ``max_seq_length`` 16."""
    import torch
    from transformers import BertModel

    torch.manual_seed(0)
    vocab = write_wordpiece_tokenizer(folder)
    BertModel(_bert_config(vocab)).eval().save_pretrained(str(folder), safe_serialization=True)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    (folder / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling), encoding="utf-8")
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_SEQ_LENGTH}), encoding="utf-8")
    return folder


def _build_classifier(folder: Path, head: str, labels: list[str], spread: float) -> Path:
    import torch
    import transformers

    torch.manual_seed(1)
    vocab = write_wordpiece_tokenizer(folder)
    # A wide initialiser makes the random heads' answers vary from text to text and token to token.
    config = _bert_config(
        vocab,
        initializer_range=spread,
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
    )
    getattr(transformers, head)(config).eval().save_pretrained(str(folder), safe_serialization=True)
    return folder


def build_text_classifier(folder: Path) -> Path:
    """A random BERT with a three-label sequence-classification head."""
    return _build_classifier(folder, "BertForSequenceClassification", TEXT_LABELS, 0.3)


def build_token_classifier(folder: Path) -> Path:
    """A random BERT with a five-label (BIO) token-classification head."""
    return _build_classifier(folder, "BertForTokenClassification", TOKEN_LABELS, 0.3)


ENCODER_BUILDERS: dict[str, Callable[[Path], Path]] = {
    "embedder": build_embedder,
    "text-classifier": build_text_classifier,
    "token-classifier": build_token_classifier,
}


def reference_embedding(folder: Path, text: str, *, pooling: str = "mean", max_tokens: int = MAX_SEQ_LENGTH) -> Any:
    """sentence-transformers' recipe in plain torch, one text at a time (no padding): transformers' own
    tokenizer cut at ``max_tokens``, ``AutoModel``, mean or CLS pooling, unit length. A float64 numpy vector."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    inputs = tokenizer(text, truncation=True, max_length=max_tokens, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**inputs).last_hidden_state[0]
    vector = hidden[0] if pooling == "cls" else hidden.mean(dim=0)
    vector = vector / vector.norm()
    return vector.double().numpy()
