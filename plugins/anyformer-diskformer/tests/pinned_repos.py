"""The original library's pinned MoE repos as ``check --describe`` what-ifs: file names as on the Hub, no header.

Sizes are approximate (the public quant tables of each family: Gemma 4 26B-A4B's QAT Q4_0 at 14.4 GB,
Qwen3.6-35B-A3B's BF16 at 65 GB, Q8_0 at 35 GB and UD-Q4_K_M at 21 GB); the architecture is what the
Hub's GGUF facts name. MiniCPM-V 4.7 35B-A3B is taken to be built on Qwen3.5/3.6-35B-A3B (qwen35moe).
"""

from __future__ import annotations

from typing import Any

GB = 10**9


def _repo(repo: str, architecture: str, files: dict[str, float], task: str = "image-text-to-text") -> dict[str, Any]:
    return {
        "repo": repo,
        "architecture": architecture,
        "task": task,
        "tags": ["gguf", task],
        "files": [{"name": name, "size": int(size * GB)} for name, size in files.items()],
    }


PINNED_MOE_REPOS: dict[str, tuple[dict[str, Any], str]] = {
    "gemma-4": (
        _repo(
            "google/gemma-4-26B-A4B-it-qat-q4_0-gguf",
            "gemma4",
            {"gemma-4-26B_q4_0-it.gguf": 14.4, "mmproj-model-f16.gguf": 1.19},
        ),
        "gemma-4-26B_q4_0-it.gguf",
    ),
    "qwen3.6": (
        _repo(
            "unsloth/Qwen3.6-35B-A3B-GGUF",
            "qwen35moe",
            {
                "BF16/Qwen3.6-35B-A3B-BF16-00001-of-00002.gguf": 49.8,
                "BF16/Qwen3.6-35B-A3B-BF16-00002-of-00002.gguf": 19.6,
                "Qwen3.6-35B-A3B-Q8_0.gguf": 36.9,
                "Qwen3.6-35B-A3B-UD-Q4_K_XL.gguf": 22.4,
                "Qwen3.6-35B-A3B-UD-Q4_K_M.gguf": 22.1,
                "Qwen3.6-35B-A3B-UD-Q3_K_M.gguf": 16.6,
                "Qwen3.6-35B-A3B-UD-IQ2_M.gguf": 11.5,
                "mmproj-F16.gguf": 0.9,
            },
        ),
        "Qwen3.6-35B-A3B-UD-Q4_K_M.gguf",
    ),
    "minicpm-v": (
        _repo(
            "openbmb/MiniCPM-V-4.7-35B-A3B-gguf",
            "qwen35moe",
            {
                "MiniCPM-V-4.7-35B-A3B-F16.gguf": 69.4,
                "MiniCPM-V-4.7-35B-A3B-Q8_0.gguf": 36.9,
                "MiniCPM-V-4.7-35B-A3B-Q4_K_M.gguf": 21.2,
                "mmproj-model-f16.gguf": 1.1,
            },
        ),
        "MiniCPM-V-4.7-35B-A3B-Q4_K_M.gguf",
    ),
    "ling-3.0-flash": (
        _repo(
            "inclusionAI/Ling-3.0-flash-GGUF",
            "bailingmoe2",
            {"Ling-3.0-flash-Q4_K_M-00001-of-00002.gguf": 31.9, "Ling-3.0-flash-Q4_K_M-00002-of-00002.gguf": 29.7},
            task="text-generation",
        ),
        "Ling-3.0-flash-Q4_K_M-00001-of-00002.gguf",
    ),
}
