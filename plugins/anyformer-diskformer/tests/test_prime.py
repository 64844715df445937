"""prime(system) checkpoints a system prompt's KV cache; chats that start with it resume there, same text."""

from __future__ import annotations

import pytest
from diskformer_reference import open_or_skip

from anyformer import AnyformerError, ErrorCode, GenerateOptions
from anyformer_diskformer.model import DiskformerModel, shared_prefix

SYSTEM = "You answer in one short sentence about the sea."
CHAT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "the sea is"}]
OTHER = [{"role": "system", "content": "Be rude."}, {"role": "user", "content": "hello"}]
GREEDY = GenerateOptions(max_new_tokens=16)


def open_model(path: str, **options: object) -> DiskformerModel:
    return open_or_skip(path, 128, **options)


def reply(model: DiskformerModel, messages: list) -> str:
    return "".join(c.delta for c in model.generate(messages, GREEDY))


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_a_primed_chat_is_the_same_text_and_resumes_after_the_system_prompt(qwen2moe_f32, device):
    plain = open_model(qwen2moe_f32, device=device)
    try:
        want = reply(plain, CHAT)
        assert plain.reused_positions == 0
    finally:
        plain.dispose()
    primed = open_model(qwen2moe_f32, device=device, prime=SYSTEM)
    try:
        assert reply(primed, CHAT) == want
        reused = primed.reused_positions
        assert reused > len(SYSTEM) // 4  # the system prompt's tokens were not run again
        reply(primed, OTHER)  # another system prompt overwrites the live KV cache...
        assert reply(primed, CHAT) == want  # ...the checkpoint does not change
        assert primed.reused_positions == reused
        assert primed.prime(SYSTEM) >= reused  # the checkpoint covers at least the tokens a chat shares with it
    finally:
        primed.dispose()


def test_prime_needs_a_system_prompt(moe_f32):
    model = open_model(moe_f32, device="cpu")
    try:
        with pytest.raises(AnyformerError) as caught:
            model.prime("")
        assert caught.value.code is ErrorCode.BAD_REQUEST
    finally:
        model.dispose()


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_a_primed_qwen35moe_resumes_only_from_the_whole_checkpoint_and_gives_the_same_text(qwen35moe_f32, device):
    from anyformer_diskformer.engines.cpu.qwen35moe import HybridCpuEngine
    from anyformer_diskformer.engines.gpu.qwen35moe import HybridGpuEngine

    plain = open_model(qwen35moe_f32, device=device)
    try:
        assert isinstance(plain.engine, HybridGpuEngine if device == "gpu" else HybridCpuEngine)
        want = reply(plain, CHAT)
    finally:
        plain.dispose()
    primed = open_model(qwen35moe_f32, device=device, prime=SYSTEM)
    try:
        assert primed._primed is not None
        kept = primed._primed[0]
        ids = primed.prompt_ids(CHAT, thinking=False)
        assert reply(primed, CHAT) == want
        # A delta net's state is the sum of every token before it: the checkpoint serves a chat only when the
        # chat's prompt starts with all of it; a shorter shared prefix is run again.
        assert primed.reused_positions == (len(kept) if ids[: len(kept)] == kept else 0)
        assert primed.reused_positions > 0  # the tiny template's system turn is a prefix of the chat's
        reply(primed, OTHER)
        assert reply(primed, CHAT) == want
    finally:
        primed.dispose()


#: A system prompt that leaves SYSTEM only at its last word: a chat with it shares most of SYSTEM's checkpoint.
NEAR = [{"role": "system", "content": SYSTEM[:-4] + "sky."}, {"role": "user", "content": "the sea is"}]


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_a_primed_gemma4_gives_the_same_text_from_its_per_layer_kv_checkpoint(gemma4_f32, device):
    """The checkpoint is many windows long (window 4): its sliding layers' rings hold only the last positions, so
    prime keeps the tokens chats share (as for qwen35moe) and a chat resumes at the checkpoint's end; a chat that
    leaves it a few tokens before the end, where the rings no longer hold the window, runs from the start. The
    chats run several windows past the checkpoint. Every reply is the unprimed one."""
    from anyformer_diskformer.engines.cpu.gemma4 import Gemma4CpuEngine
    from anyformer_diskformer.engines.gpu.gemma4 import Gemma4GpuEngine

    # GPU steps of 2 tokens: rings of the window + 1 rows (as short as the CPU's, so the checkpoint outgrows them).
    step = {"prompt_step": 2} if device == "gpu" else {}
    plain = open_model(gemma4_f32, device=device, **step)
    try:
        assert isinstance(plain.engine, Gemma4GpuEngine if device == "gpu" else Gemma4CpuEngine)
        want, near = reply(plain, CHAT), reply(plain, NEAR)
    finally:
        plain.dispose()
    primed = open_model(gemma4_f32, device=device, prime=SYSTEM, **step)
    try:
        assert primed._primed is not None
        kept = primed._primed[0]
        window = primed.engine.config.n_swa
        ids = primed.prompt_ids(CHAT, thinking=False)
        assert ids[: len(kept)] == kept and len(kept) > 3 * window
        assert len(ids) + 16 > len(kept) + 3 * window  # the reply's 16 tokens run the chat on past the checkpoint
        assert reply(primed, CHAT) == want
        assert primed.reused_positions == len(kept)
        assert reply(primed, NEAR) == near
        shared = shared_prefix(primed.prompt_ids(NEAR, thinking=False), kept)
        assert window < shared < len(kept) - window  # the rings lost the window before where it leaves
        assert not primed.engine.resumes_at(len(kept), shared)
        assert primed.reused_positions == 0
        reply(primed, OTHER)
        assert reply(primed, CHAT) == want
        assert primed.reused_positions == len(kept)
    finally:
        primed.dispose()
