"""A sample model for tests: an ``ngram.json`` trained from a short text, written into a folder.

``anyformer.describe(folder)`` then describes it like any local model, so the conformance kit
loads it through the same path a user's model takes.
"""

from __future__ import annotations

import os
from pathlib import Path

from anyformer_template.ngram import train

__all__ = ["SAMPLE_ORDER", "SAMPLE_TEXT", "write_sample"]

#: The text the sample model learns: long enough that a greedy answer runs past a few tokens.
SAMPLE_TEXT = (
    "the quick brown fox jumps over the lazy dog while the small cat sleeps on the warm mat. "
    "a tiny model learns which letter comes after the last few letters it has seen, "
    "and then it writes one letter at a time until it reaches the end of the line. "
    "hello there, said the fox to the cat, and the cat said hello back to the fox.\n"
)
#: The order of the sample model: each letter is predicted from the three before it.
SAMPLE_ORDER = 4
#: The file name the template backend reads.
MODEL_FILE = "ngram.json"


def write_sample(folder: str | os.PathLike[str], text: str = SAMPLE_TEXT, order: int = SAMPLE_ORDER) -> Path:
    """Train a model on ``text`` and write it as ``folder/ngram.json``; return the file's path."""
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    return train(text, order).save(target / MODEL_FILE)
