"""What the installed torch and transformers can do, read from their files without importing them.

``can_run`` runs on every ``anyformer check`` and must stay fast: importing transformers takes
seconds, so its auto-model tables (``models/auto/modeling_auto.py``) and torch's build facts
(``torch/version.py``) are read as text. Both files have kept these shapes across many releases;
when a file cannot be read or parsed, the answer is None and ``can_run`` says so (``runtime``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import re
from pathlib import Path

#: The auto-model tables by task: the mapping of ``model_type`` to the class that runs it.
TABLES = {
    "text-generation": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "feature-extraction": "MODEL_MAPPING_NAMES",
    "text-classification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "token-classification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "image-classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "object-detection": "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES",
    "depth-estimation": "MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES",
    "automatic-speech-recognition": "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "image-text-to-text": "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
}
#: Tables whose union answers one task (a segmenter is a semantic, universal or instance head).
MERGED_TABLES = {
    "image-segmentation": (
        "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",
        "MODEL_FOR_UNIVERSAL_SEGMENTATION_MAPPING_NAMES",
        "MODEL_FOR_INSTANCE_SEGMENTATION_MAPPING_NAMES",
    ),
}
#: One entry of such a table: ``("llama", "LlamaForCausalLM"),``.
_ENTRY = re.compile(r'\(\s*"([\w.\-]+)"\s*,\s*"(\w+)"\s*\)')
#: torch/version.py's CUDA and ROCm versions: ``cuda: Optional[str] = '12.4'`` (None on a CPU build).
_BUILD_FACT = re.compile(r"^(cuda|hip)\s*(?::[^=]*)?=\s*'([^']+)'", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Installed:
    """The versions of torch and transformers, the architectures per task, and torch's GPU build."""

    transformers: str
    torch: str
    #: task → {model_type: class name}
    classes: dict[str, dict[str, str]]
    #: ``cuda`` or ``hip`` when torch was built for that GPU runtime, else None (a CPU build).
    gpu_runtime: str | None

    def class_for(self, task: str, model_type: str) -> str | None:
        """The class transformers loads ``model_type`` with for ``task``, or None when it has none."""
        return self.classes.get(task, {}).get(model_type)


def _package_folder(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _table(source: str, name: str) -> dict[str, str]:
    """The entries of one ``NAME = OrderedDict([...])`` table in ``source``."""
    start = source.find(f"{name} = OrderedDict(")
    if start < 0:
        return {}
    end = source.find("\n)", start)
    return dict(_ENTRY.findall(source[start : end if end > 0 else None]))


def _gpu_runtime(torch_folder: Path) -> str | None:
    try:
        text = (torch_folder / "version.py").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    facts = dict(_BUILD_FACT.findall(text))
    return "cuda" if "cuda" in facts else "hip" if "hip" in facts else None


@functools.lru_cache(maxsize=1)
def installed() -> Installed | None:
    """The installed torch and transformers, or None when either is missing or its files are unreadable."""
    transformers_folder = _package_folder("transformers")
    torch_folder = _package_folder("torch")
    if transformers_folder is None or torch_folder is None:
        return None
    import importlib.metadata  # here, not at the top: a warm `anyformer` command imports no metadata machinery

    try:
        source = (transformers_folder / "models" / "auto" / "modeling_auto.py").read_text(encoding="utf-8")
        versions = importlib.metadata.version("transformers"), importlib.metadata.version("torch")
    except (OSError, UnicodeDecodeError, importlib.metadata.PackageNotFoundError):
        return None
    classes = {task: _table(source, table) for task, table in TABLES.items()}
    for task, names in MERGED_TABLES.items():
        classes[task] = {key: value for name in reversed(names) for key, value in _table(source, name).items()}
    if not any(classes.values()):
        return None
    return Installed(
        transformers=versions[0], torch=versions[1], classes=classes, gpu_runtime=_gpu_runtime(torch_folder)
    )
