"""Which GGUFs of a description are language models a backend could load, and the quant each name states.

Names only: nothing here opens a file. A complete ``-0000N-of-0000M`` split set is one candidate
(its path is the first shard's), a projector (``mmproj``) never is, and an incomplete set is
listed with the shards it lacks, so that a backend can say which one is missing. Which candidate
a backend loads is the backend's choice (:func:`order_gguf_candidates` with its own preference).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence

from anyformer.contract._errors import AnyformerError, ErrorCode
from anyformer.contract._model import Model, ModelFile

#: Weight types quantizers put in GGUF file names (unsloth's dynamic "UD-" and "_XL" variants are
#: K-quant mixes). A name ending in a quant-like token outside this list (Prism's PTQ1_0) is still
#: reported by :func:`gguf_quant`, so a backend can refuse a fork's format by name.
KNOWN_GGUF_QUANTS = frozenset(
    {
        "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
        "Q2_K", "Q2_K_S", "Q2_K_L", "Q2_K_XL",
        "Q3_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q3_K_XL",
        "Q4_K", "Q4_K_S", "Q4_K_M", "Q4_K_L", "Q4_K_XL",
        "Q5_K", "Q5_K_S", "Q5_K_M", "Q5_K_L", "Q5_K_XL",
        "Q6_K", "Q6_K_L", "Q6_K_XL", "Q8_K_XL",
        "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8",
        "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M",
        "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M", "IQ4_NL", "IQ4_XS",
        "TQ1_0", "TQ2_0", "MXFP4", "MXFP4_MOE",
        "F16", "BF16", "F32",
    }
)  # fmt: skip

_SPLIT_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
# A quant-looking token at the end of a file stem: letters and digits joined by underscores.
_QUANT_TOKEN = re.compile(r"[-_.]((?:UD-)?[A-Z]*\d+(?:_[A-Z0-9]+)*)$", re.IGNORECASE)
# Google's QAT files name the quant before the tuning: gemma-4-26B_q4_0-it.gguf.
_INNER_QUANT = re.compile(r"[-_.]((?:I?Q\d_[A-Z0-9_]*?)|BF16|F16|F32)(?=[-_.](?:it|instruct|chat)$)", re.IGNORECASE)


def is_projector(name: str) -> bool:
    """True for a multimodal projector (``mmproj``): a vision or audio tower, never the language model."""
    return "mmproj" in name.lower().rsplit("/", 1)[-1]


def gguf_quant(name: str) -> str | None:
    """The quant a GGUF's name states (``Q4_K_M``; ``UD-Q4_K_XL`` is ``Q4_K_XL``), or None when it states none.

    A quant-like token that is no known type (``PTQ1_0``) is returned as it is written, upper-cased.
    """
    stem = _SPLIT_NAME.sub("", name)
    stem = re.sub(r"\.gguf$", "", stem, flags=re.IGNORECASE).rsplit("/", 1)[-1]
    match = _QUANT_TOKEN.search(stem) or _INNER_QUANT.search(stem)
    if not match:
        return None
    token = match.group(1).upper().removeprefix("UD-")
    if token in KNOWN_GGUF_QUANTS:
        return token
    return token if re.fullmatch(r"[A-Z]+\d+(_[A-Z0-9]+)*", token) and "_" in token else None


@dataclasses.dataclass(frozen=True)
class GGUFCandidate:
    """One language model a repo's GGUFs hold: a file, or a split set's shards in order.

    ``missing`` names the shards an incomplete set lacks (empty for a loadable candidate).
    """

    files: tuple[ModelFile, ...]
    quant: str | None
    missing: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The file a reader opens: the file itself, or the first shard of a split set."""
        return self.files[0].name

    @property
    def first(self) -> ModelFile:
        """The first (or only) file."""
        return self.files[0]

    @property
    def names(self) -> tuple[str, ...]:
        """Every file a load downloads, in shard order."""
        return tuple(f.name for f in self.files)

    @property
    def size(self) -> int:
        """Bytes of all the files together (0 where the listing has no sizes)."""
        return sum(f.size or 0 for f in self.files)

    @property
    def complete(self) -> bool:
        """False for a split set with shards missing from the listing."""
        return not self.missing


def gguf_candidates(model: Model) -> tuple[GGUFCandidate, ...]:
    """The language-model GGUF candidates of a description, in listing order (a set where its first shard is)."""
    found: list[GGUFCandidate | tuple[str, int]] = []
    sets: dict[tuple[str, int], dict[int, ModelFile]] = {}
    for model_file in model.files:
        if model_file.format != "gguf" or is_projector(model_file.name):
            continue
        split = _SPLIT_NAME.search(model_file.name)
        if split is None:
            found.append(GGUFCandidate(files=(model_file,), quant=gguf_quant(model_file.name)))
            continue
        key = (model_file.name[: split.start()], int(split.group(2)))
        if key not in sets:
            sets[key] = {}
            found.append(key)
        sets[key][int(split.group(1))] = model_file
    candidates = []
    for entry in found:
        if isinstance(entry, GGUFCandidate):
            candidates.append(entry)
            continue
        base, count = entry
        parts = sets[entry]
        present = tuple(parts[i] for i in sorted(parts) if 1 <= i <= count)
        missing = tuple(f"{base}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1) if i not in parts)
        if present:
            candidates.append(GGUFCandidate(files=present, quant=gguf_quant(present[0].name), missing=missing))
    return tuple(candidates)


def order_gguf_candidates(
    candidates: Iterable[GGUFCandidate], preference: Sequence[str], readable: Iterable[str] | None = None
) -> list[GGUFCandidate]:
    """Complete candidates in a backend's order: ``preference``'s quants first, then the others smallest first.

    ``readable`` (quant names) drops candidates whose name states a quant outside it; a name stating
    no quant is kept (its header decides).
    """
    allowed = None if readable is None else set(readable)
    kept = [c for c in candidates if c.complete and (allowed is None or c.quant is None or c.quant in allowed)]

    def key(candidate: GGUFCandidate) -> tuple[int, int, str]:
        rank = preference.index(candidate.quant) if candidate.quant in preference else len(preference)
        return (rank, candidate.size, candidate.name)

    return sorted(kept, key=key)


def chosen_by_name(model: Model, wanted: object) -> GGUFCandidate | None:
    """The candidate a ``file=`` option names (a file, a shard of a set, or a set's name), or None when unset.

    A name that is no language-model GGUF of the repo is ``BAD_REQUEST`` listing the weight files.
    """
    if wanted is None:
        return None
    candidates = gguf_candidates(model)
    if isinstance(wanted, str):
        for candidate in candidates:
            if wanted in candidate.names or _SPLIT_NAME.sub("", candidate.name) == wanted.removesuffix(".gguf"):
                if candidate.missing:
                    raise AnyformerError(
                        ErrorCode.BAD_REQUEST,
                        f"file={wanted}: the split set lacks {candidate.missing[0]}",
                    )
                return candidate
    names = ", ".join(c.name for c in candidates) or "none"
    raise AnyformerError(
        ErrorCode.BAD_REQUEST,
        f"file={wanted!r:.120} is no language-model GGUF of {model.ref}; its weight files: {names}",
    )


#: The order ``describe`` reads one header in (for the architecture): the usual trade-offs first.
DESCRIBE_ORDER = ("Q4_K_M", "Q4_0", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K", "Q8_0")


def describing_candidate(model: Model) -> GGUFCandidate | None:
    """The candidate whose header ``describe`` reads for the architecture: any would do; a usual quant first."""
    order = order_gguf_candidates(gguf_candidates(model), DESCRIBE_ORDER)
    return order[0] if order else None
