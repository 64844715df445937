"""A character-level n-gram language model: the whole engine of the template backend.

A model maps each context (the last 0 to ``order - 1`` characters) to how often each character
followed it in the training text. Generation looks up the longest context it knows, takes the
most frequent next character (greedy, ties to the smallest character) or samples one, and ends
when it produces the end character. Nothing is kept between calls: the model is stateless.

This module knows nothing about anyformer, like any engine a backend wraps: it raises
:class:`NgramFormatError` and the plugin turns that into ``AnyformerError(BAD_MODEL)``.

The file format, ``ngram.json``::

    {"format": "anyformer-ngram", "version": 1, "order": 4, "end": "\\n",
     "table": {"": {"a": 12, "b": 3}, "th": {"e": 5}}}
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
from collections import Counter, defaultdict
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["FORMAT", "MAX_FILE_BYTES", "MAX_ORDER", "NgramFormatError", "NgramModel", "parse", "read_model", "train"]

#: The value of the ``format`` field that marks a file as an n-gram model.
FORMAT = "anyformer-ngram"
#: The file format version this module reads and writes.
VERSION = 1
#: The longest context plus one: larger orders only memorise the training text.
MAX_ORDER = 16
#: The largest ``ngram.json`` read; a bigger one is a mistake or a hostile file.
MAX_FILE_BYTES = 64 * 2**20


class NgramFormatError(ValueError):
    """A model file or table that is not a valid n-gram model; the message names the fault."""


@dataclasses.dataclass(frozen=True)
class NgramModel:
    """An n-gram table: ``order``, the counts per context, and the character that ends an answer."""

    order: int
    table: Mapping[str, Mapping[str, int]]
    end: str = "\n"

    def next_counts(self, context: str) -> Mapping[str, int]:
        """The counts after the longest suffix of ``context`` the table knows (at worst the empty one)."""
        for start in range(max(0, len(context) - (self.order - 1)), len(context) + 1):
            counts = self.table.get(context[start:])
            if counts:
                return counts
        raise NgramFormatError("the table has no counts for the empty context")

    def generate(self, prompt: str, *, temperature: float = 0.0, seed: int | None = None) -> Generator[str, None, None]:
        """Yield one character at a time after ``prompt``, the end character last.

        ``temperature`` 0 is greedy and repeatable; above 0 the counts are sharpened or flattened
        and a ``random.Random(seed)`` draws, so the same seed draws the same text.
        """
        rng = random.Random(seed)
        context = self._tail(prompt)
        while True:
            char = _pick(self.next_counts(context), temperature, rng)
            yield char
            if char == self.end:
                return
            context = self._tail(context + char)

    def _tail(self, text: str) -> str:
        # text[-0:] is the whole string, so an order-1 model keeps no context at all.
        return text[-(self.order - 1) :] if self.order > 1 else ""

    def to_dict(self) -> dict[str, Any]:
        """The model as ``ngram.json`` data, in a stable order."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "order": self.order,
            "end": self.end,
            "table": {context: dict(sorted(self.table[context].items())) for context in sorted(self.table)},
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the model to ``path`` as JSON and return the path."""
        target = Path(path)
        target.write_text(json.dumps(self.to_dict(), ensure_ascii=False, indent=0), encoding="utf-8")
        return target


def _pick(counts: Mapping[str, int], temperature: float, rng: random.Random) -> str:
    if temperature <= 0:
        return min(counts.items(), key=lambda item: (-item[1], item[0]))[0]
    chars = sorted(counts)
    top = max(math.log(counts[c]) for c in chars)
    # Weights in log space: count ** (1 / temperature) overflows for small temperatures.
    weights = [math.exp((math.log(counts[c]) - top) / temperature) for c in chars]
    return rng.choices(chars, weights=weights)[0]


def train(text: str, order: int = 4, *, end: str = "\n") -> NgramModel:
    """Count every context of up to ``order - 1`` characters in ``text`` and what followed it.

    ``text`` gets ``end`` appended when it lacks it, so a generation can always end.
    """
    if not isinstance(text, str) or not text:
        raise ValueError("train needs a non-empty text")
    _check_order(order)
    _check_end(end)
    if not text.endswith(end):
        text += end
    table: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for index, char in enumerate(text):
        for size in range(min(order - 1, index) + 1):
            table[text[index - size : index]][char] += 1
    return NgramModel(order=order, table={context: dict(counts) for context, counts in table.items()}, end=end)


def read_model(path: str | os.PathLike[str]) -> NgramModel:
    """Read and validate an ``ngram.json``; anything wrong raises :class:`NgramFormatError`."""
    source = Path(path)
    size = source.stat().st_size
    if size > MAX_FILE_BYTES:
        raise NgramFormatError(f"{source.name} is {size} bytes, over the {MAX_FILE_BYTES} a model file may have")
    try:
        data = json.loads(source.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise NgramFormatError(f"{source.name} is not valid JSON: {exc}") from exc
    return parse(data)


def parse(data: Any) -> NgramModel:
    """Validate ``ngram.json`` data and build the model."""
    if not isinstance(data, dict):
        raise NgramFormatError("an n-gram model is a JSON object")
    if data.get("format") != FORMAT:
        raise NgramFormatError(f"'format' must be {FORMAT!r}, got {data.get('format')!r}")
    if data.get("version", VERSION) != VERSION:
        raise NgramFormatError(f"'version' {data.get('version')!r} is not one this engine reads ({VERSION})")
    order = _check_order(data.get("order"))
    end = data.get("end", "\n")
    _check_end(end)
    raw_table = data.get("table")
    if not isinstance(raw_table, dict):
        raise NgramFormatError("'table' must be an object of contexts")
    table: dict[str, dict[str, int]] = {}
    for context, counts in raw_table.items():
        if len(context) > order - 1:
            raise NgramFormatError(f"context {context!r} is longer than order - 1 = {order - 1}")
        if not isinstance(counts, dict) or not counts:
            raise NgramFormatError(f"table[{context!r}] must be a non-empty object of counts")
        for char, count in counts.items():
            if len(char) != 1:
                raise NgramFormatError(f"table[{context!r}] has {char!r}, not a single character")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise NgramFormatError(f"table[{context!r}][{char!r}] must be a positive integer, got {count!r}")
        table[context] = dict(counts)
    if "" not in table:
        raise NgramFormatError("'table' has no entry for the empty context, so generation could get stuck")
    return NgramModel(order=order, table=table, end=end)


def _check_order(order: Any) -> int:
    if isinstance(order, bool) or not isinstance(order, int) or not 1 <= order <= MAX_ORDER:
        raise NgramFormatError(f"'order' must be an integer from 1 to {MAX_ORDER}, got {order!r}")
    return order


def _check_end(end: Any) -> None:
    if not isinstance(end, str) or len(end) != 1:
        raise NgramFormatError(f"'end' must be a single character, got {end!r}")
