"""Which GGUF of a repo is the language model, at which quant, as one file or a split set."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from anyformer import Model, ModelFile

#: Quant preference: the best size/quality trade-offs first (as the original's wllama back end).
PREFERRED_QUANTS = ("Q4_K_M", "Q4_0", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K", "Q8_0")

# Every other weight type llama.cpp reads, by the name quantizers give files (unsloth's dynamic
# "UD-" and "_XL" variants are K-quants too). A name ending in a type outside this list (Prism's
# PTQ1_0, say) is a fork's format that llama.cpp refuses.
_OTHER_TYPES = (
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q2_K",
    "Q2_K_S",
    "Q2_K_L",
    "Q2_K_XL",
    "Q3_K",
    "Q3_K_S",
    "Q3_K_M",
    "Q3_K_L",
    "Q3_K_XL",
    "Q4_K",
    "Q4_K_L",
    "Q4_K_XL",
    "Q5_K",
    "Q5_K_L",
    "Q5_K_XL",
    "Q6_K_L",
    "Q6_K_XL",
    "Q8_K_XL",
    "Q4_0_4_4",
    "Q4_0_4_8",
    "Q4_0_8_8",
    "IQ1_S",
    "IQ1_M",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ2_S",
    "IQ2_M",
    "IQ3_XXS",
    "IQ3_XS",
    "IQ3_S",
    "IQ3_M",
    "IQ4_NL",
    "IQ4_XS",
    "TQ1_0",
    "TQ2_0",
    "MXFP4",
    "MXFP4_MOE",
    "F16",
    "BF16",
    "F32",
)
_KNOWN = {q.upper() for q in PREFERRED_QUANTS + _OTHER_TYPES}
SPLIT_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
# A quant-looking token at the end of a file stem: letters and digits joined by underscores.
_QUANT_TOKEN = re.compile(r"[-_.]((?:UD-)?[A-Z]*\d+(?:_[A-Z0-9]+)*)$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class GgufChoice:
    """The language-model GGUF to load: its files (one, or a complete split set in order) and quant."""

    files: tuple[ModelFile, ...]
    quant: str | None

    @property
    def first(self) -> ModelFile:
        """The file llama.cpp opens (the first shard of a split set)."""
        return self.files[0]

    @property
    def size(self) -> int:
        """Bytes of all the files together (0 where the listing has no sizes)."""
        return sum(f.size or 0 for f in self.files)


def is_projector(name: str) -> bool:
    """True for a multimodal projector (``mmproj``): a vision tower, never the language model."""
    return "mmproj" in name.lower().rsplit("/", 1)[-1]


def quant_of(name: str) -> str | None:
    """The quant a GGUF's name states (``Q4_K_M``), or None when the name states none."""
    stem = SPLIT_NAME.sub("", name)
    stem = re.sub(r"\.gguf$", "", stem, flags=re.IGNORECASE).rsplit("/", 1)[-1]
    match = _QUANT_TOKEN.search(stem)
    if not match:
        return None
    token = match.group(1).upper()
    token = token.removeprefix("UD-")
    if token in _KNOWN:
        return token
    # Quant-like but unknown (PTQ1_0, PQ2_0): report it so the caller can refuse it.
    return token if re.fullmatch(r"[A-Z]+\d+(_[A-Z0-9]+)*", token) and "_" in token else None


def readable_by_llamacpp(quant: str | None) -> bool:
    """True when llama.cpp reads this quant (or the name states none, and the header decides)."""
    return quant is None or quant in _KNOWN


def _rank(quant: str | None) -> int:
    if quant in PREFERRED_QUANTS:
        return PREFERRED_QUANTS.index(quant)
    return len(PREFERRED_QUANTS)


def _candidates(files: Sequence[ModelFile]) -> list[GgufChoice]:
    models = [f for f in files if f.format == "gguf" and not is_projector(f.name)]
    choices: list[GgufChoice] = []
    sets: dict[tuple[str, int], dict[int, ModelFile]] = {}
    for model_file in models:
        split = SPLIT_NAME.search(model_file.name)
        if split is None:
            choices.append(GgufChoice(files=(model_file,), quant=quant_of(model_file.name)))
            continue
        base = model_file.name[: split.start()]
        sets.setdefault((base, int(split.group(2))), {})[int(split.group(1))] = model_file
    for (_base, count), parts in sets.items():
        if sorted(parts) == list(range(1, count + 1)):  # an incomplete set is no model at all
            ordered = tuple(parts[i] for i in range(1, count + 1))
            choices.append(GgufChoice(files=ordered, quant=quant_of(ordered[0].name)))
    return choices


def choose_gguf(model: Model) -> GgufChoice | None:
    """The language-model GGUF llama.cpp should load, by quant preference; None when there is none.

    Projector files are skipped, a complete split set counts as one model and an incomplete one as
    none, and a name stating a quant llama.cpp does not read is skipped.
    """
    readable = [c for c in _candidates(model.files) if readable_by_llamacpp(c.quant)]
    if not readable:
        return None
    return min(readable, key=lambda c: (_rank(c.quant), c.first.name))


def projector_for(model: Model) -> ModelFile | None:
    """The repo's multimodal projector (``mmproj``), preferring f16, or None."""
    projectors = [f for f in model.files if f.format == "gguf" and is_projector(f.name)]
    if not projectors:
        return None
    return min(projectors, key=lambda f: (0 if "f16" in f.name.lower() else 1, f.name))
