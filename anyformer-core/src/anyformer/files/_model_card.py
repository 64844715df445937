"""The tags of a local model folder, from its README.md front matter (the model card, as on the Hub).

On the Hub, a repo's tags (``text-diffusion``, ``block-diffusion``…) come from the YAML front matter of
its README.md. A local folder has no Hub API behind it, so ``describe`` reads the same block here.
Only two keys are read, ``tags`` and ``pipeline_tag``, with a tiny reader for the two YAML list
forms model cards use (``tags: [a, b]`` and a ``- a`` block list), so no YAML library is needed or
trusted. The card is a stranger's file: it is read bounded, and anything unexpected is ignored, not
raised, since a malformed card never stops a model from loading.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from anyformer.files._byte_source import read_file_prefix

#: The most bytes of README.md read: front matter sits at the top and is a few hundred bytes.
MAX_CARD_BYTES = 64 * 1024
#: The most tags kept from one card.
MAX_TAGS = 256
_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)\s*:\s*(.*)$")


@dataclasses.dataclass(frozen=True)
class CardFacts:
    """What the model card's front matter says: its tags and its pipeline tag (task)."""

    tags: tuple[str, ...] = ()
    pipeline_tag: str | None = None


def _scalar(text: str) -> str:
    """A YAML scalar without its quotes and trailing comment."""
    text = text.strip()
    if text[:1] in ("'", '"') and text[-1:] == text[:1] and len(text) >= 2:
        return text[1:-1]
    return text.split(" #", 1)[0].strip()


def _front_matter(text: str) -> list[str]:
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return []
    for end in range(1, len(lines)):
        if lines[end].strip() == "---":
            return lines[1:end]
    return []


def read_card_facts(path: Path) -> CardFacts:
    """Read ``tags`` and ``pipeline_tag`` from a README.md's front matter; an unreadable card gives none."""
    try:
        raw = read_file_prefix(path, MAX_CARD_BYTES)
    except OSError:
        return CardFacts()
    lines = _front_matter(raw.decode("utf-8", errors="replace"))
    tags: list[str] = []
    pipeline_tag = None
    key = None
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[:1].isspace() or line.startswith("-"):
            # A block-list item belongs to the last top-level key.
            item = line.strip()
            if key == "tags" and item.startswith("-"):
                tags.append(_scalar(item[1:]))
            continue
        match = _KEY.match(line)
        if match is None:
            key = None
            continue
        key, value = match.group(1), match.group(2).strip()
        if key == "tags" and value.startswith("[") and value.endswith("]"):
            tags.extend(_scalar(part) for part in value[1:-1].split(",") if part.strip())
        elif key == "tags" and value:
            tags.append(_scalar(value))
        elif key == "pipeline_tag" and value:
            pipeline_tag = _scalar(value) or None
    clean = tuple(dict.fromkeys(t for t in tags if t and len(t) <= 200))[:MAX_TAGS]
    return CardFacts(tags=clean, pipeline_tag=pipeline_tag)
