"""llama.cpp's logits for one prompt and its greedy continuation: the reference every engine test compares with."""

from __future__ import annotations

import numpy as np
from llama_cpp import Llama

PROMPT = [1, 60, 75, 82, 9, 100, 71, 12]
STEPS = 32
CTX = 64


def llama_steps(path: str) -> tuple[np.ndarray, list[int]]:
    """llama.cpp's logits for the prompt and each of ``STEPS`` greedy tokens, and those tokens."""
    llm = Llama(path, n_ctx=CTX, logits_all=True, type_k=0, type_v=0, verbose=False, seed=0)
    llm.eval(PROMPT)
    rows = [np.array(llm.scores[: len(PROMPT)])]
    tokens = []
    for _ in range(STEPS):
        token = int(np.argmax(rows[-1][-1]))
        tokens.append(token)
        llm.eval([token])
        rows.append(np.array(llm.scores[llm.n_tokens - 1 : llm.n_tokens]))
    llm.close()
    return np.concatenate(rows), tokens
