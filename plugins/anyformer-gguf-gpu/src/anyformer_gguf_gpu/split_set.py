"""Split GGUF sets (``name-00001-of-00003.gguf`` ...) as llama.cpp reads them: one model, opened by its first shard.

llama.cpp's ``gguf-split`` writes the metadata into the first shard and spreads the tensors over all
of them, each shard carrying ``split.no`` (0-based), ``split.count`` and ``split.tensors.count``. A
loader given the first shard's path finds the others by name in the same folder
(``<prefix>-%05d-of-%05d.gguf``) and refuses a set with a shard missing. The same names decide, from a
repo's listing alone, whether a set is whole (:func:`partial_set_refusal`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from anyformer.plugin import AnyformerError, ErrorCode, GGUFHeader, Model, Refusal, Verdict

#: A shard's name: groups are the prefix, its 1-based index and the set's count.
_SHARD = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)

_SPLIT_COUNT = "split.count"


def shard_name(prefix: str, index: int, count: int) -> str:
    """The file name of shard ``index`` (1-based) of ``count``, as llama.cpp's ``llama_split_path`` spells it."""
    return f"{prefix}-{index:05d}-of-{count:05d}.gguf"


def shard_of(name: str) -> tuple[str, int, int] | None:
    """``(prefix, index, count)`` of a shard's name, or None for a name that is not a shard's."""
    match = _SHARD.match(name)
    if match is None:
        return None
    return match.group(1), int(match.group(2)), int(match.group(3))


def set_paths(path: str, header: GGUFHeader) -> list[str]:
    """The files of the model whose first file is ``path``, in shard order: ``[path]`` for a file that is not split.

    ``BAD_MODEL`` where ``path`` is a later shard (llama.cpp opens a set only by its first), where a
    shard named by the set is not in the folder (the message names it), or where the header says
    ``split.count`` above 1 and the name is not a shard's.
    """
    folder, name = os.path.split(path)
    shard = shard_of(name)
    count = header.kv.get(_SPLIT_COUNT)
    if shard is None:
        if isinstance(count, int) and count > 1:
            raise AnyformerError(
                ErrorCode.BAD_MODEL, f"{name} says it is one of {count} shards but is not named like one"
            )
        return [path]
    prefix, index, count_in_name = shard
    if index != 1:
        first = shard_name(prefix, 1, count_in_name)
        raise AnyformerError(
            ErrorCode.BAD_MODEL, f"{name} is shard {index} of {count_in_name}: a split set opens by its first, {first}"
        )
    paths = [os.path.join(folder, shard_name(prefix, i, count_in_name)) for i in range(1, count_in_name + 1)]
    paths[0] = path  # as given (the case of its suffix included)
    for i, shard_path in enumerate(paths[1:], start=2):
        if not os.path.isfile(shard_path):
            raise AnyformerError(
                ErrorCode.BAD_MODEL,
                f"split set {prefix}: shard {i} of {count_in_name} ({os.path.basename(shard_path)}) is missing",
            )
    return paths


def missing_shard(names: Iterable[str], name: str) -> str | None:
    """The first shard of ``name``'s set that is not among ``names``, or None (complete, or not a shard)."""
    shard = shard_of(name)
    if shard is None:
        return None
    prefix, _, count = shard
    present = {n.lower() for n in names}
    for i in range(1, count + 1):
        wanted = shard_name(prefix, i, count)
        if wanted.lower() not in present:
            return wanted
    return None


def partial_set_refusal(backend: str, model: Model) -> Verdict | None:
    """A ``model`` refusal naming the missing shard where every language-model GGUF of the repo is a shard of an
    incomplete set (nothing whole is left to choose), else None."""
    names = [f.name for f in model.files_of("gguf") if "mmproj" not in f.name.lower()]
    if not names:
        return None
    gaps = [(name, missing_shard(names, name)) for name in names]
    if any(gap is None for _, gap in gaps):
        return None  # a whole file or a whole set is there to choose
    name, gap = gaps[0]
    return Verdict.refuse(backend, Refusal.MODEL, f"{name} is one shard of a split set whose shard {gap} is missing")
