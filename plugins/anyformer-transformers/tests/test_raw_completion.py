"""Raw completions (``generate(prompt=...)``) against transformers' own ``generate`` and a torch forward pass."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import EOS_ID

import anyformer
from anyformer import AnyformerError, ErrorCode

TEXT = "Once upon a time"
TOKENS = 16


def _reference(folder: Path, text: str, tokens: int) -> tuple[str, list[list[float]]]:
    """transformers' greedy continuation of ``text`` (its tokenizer's own special tokens) and each step's
    log-softmax over the vocabulary."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    inputs = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=tokens,
            do_sample=False,
            eos_token_id=EOS_ID,
            pad_token_id=EOS_ID,
            output_logits=True,
            return_dict_in_generate=True,
        )
    new = out.sequences[0, inputs["input_ids"].shape[1] :]
    steps = [torch.log_softmax(step[0].float(), dim=-1).tolist() for step in out.logits]
    return str(tokenizer.decode(new, skip_special_tokens=True)), steps


def test_a_raw_prompt_continues_as_transformers_generate_with_logprobs(tiny_llama_dir: Path) -> None:
    expected, steps = _reference(tiny_llama_dir, TEXT, TOKENS)
    with anyformer.load(tiny_llama_dir, backend="transformers", isolate=False) as model:
        assert model.raw_text
        chunks = list(model.generate(prompt=TEXT, max_new_tokens=TOKENS, logprobs=3))
    assert chunks[-1].text == expected and expected
    scored = [entry for chunk in chunks for entry in chunk.logprobs]
    assert len(scored) == chunks[-1].tokens
    for entry, step in zip(scored, steps, strict=False):
        best = max(range(len(step)), key=step.__getitem__)
        assert entry.logprob == pytest.approx(step[best], abs=1e-4)  # greedy: the chosen token is the likeliest
        assert len(entry.top) == 3 and entry.top[0][1] == pytest.approx(step[best], abs=1e-4)
        assert [v for _, v in entry.top] == sorted((v for _, v in entry.top), reverse=True)


def test_a_suffix_is_refused(tiny_llama_dir: Path) -> None:
    with anyformer.load(tiny_llama_dir, backend="transformers", isolate=False) as model:
        with pytest.raises(AnyformerError) as caught:
            list(model.generate(prompt=TEXT, suffix=" the end", max_new_tokens=4))
    assert caught.value.code is ErrorCode.BAD_REQUEST and "suffix" in str(caught.value)
