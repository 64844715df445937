"""Chat templates that loop 10^10 times or render gigabytes, in real GGUFs, through the real engine.

Before the render budget, the loop held a worker at 100 % CPU for ever (``anyformer run`` printed
nothing and a server request never answered) and the size bomb took gigabytes before tokenizing
failed. Each GGUF is written by gguf's writer; each run must end within the render limit with
``BAD_MODEL``, with the worker's memory bounded, and leave no worker behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_gguf import write_tiny_llama

import anyformer
from anyformer import AnyformerError, ErrorCode
from anyformer._chat_template import HARD_STOP_GRACE_SECONDS, RENDER_SECONDS

#: Two nested loops of 10^5: 10^10 steps that output nothing.
LOOP_TEMPLATE = (
    "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}{{ messages[0].content }}"
)
#: 28 doublings of 8 characters: 2 Gi characters from a template of a few hundred bytes.
SIZE_BOMB_TEMPLATE = "{% set s = 'xxxxxxxx' %}" + "{% set s = s ~ s %}" * 28 + "{{ s }}{{ messages[0].content }}"
#: What a worker may hold at its peak: the tiny model, llama.cpp and Python, with the render's largest value.
WORKER_PEAK_BYTES = 600 * 2**20
HOSTILE = {"loop": LOOP_TEMPLATE, "size-bomb": SIZE_BOMB_TEMPLATE}


@pytest.fixture(scope="module", params=list(HOSTILE), ids=list(HOSTILE))
def hostile_gguf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp(f"hostile-{request.param}")
    return write_tiny_llama(folder / f"{request.param}-F32.gguf", chat_template=HOSTILE[request.param])


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.safety("G16")
@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "worker"])
def test_a_hostile_template_ends_within_the_limit_with_bounded_memory(hostile_gguf: Path, isolate: bool) -> None:
    with anyformer.load(hostile_gguf, backend="llamacpp", isolate=isolate) as loaded:
        started = time.monotonic()
        with pytest.raises(AnyformerError) as caught:
            loaded.complete("hi", max_new_tokens=2)
        elapsed = time.monotonic() - started
        assert caught.value.code is ErrorCode.BAD_MODEL and "chat template" in caught.value.message
        assert elapsed < RENDER_SECONDS + 2, f"{elapsed:.1f} s"
        pid = loaded.worker_pid if isolate else None
        if pid is not None:
            assert _peak_rss(pid) < WORKER_PEAK_BYTES, f"the worker peaked at {_peak_rss(pid) / 2**20:.0f} MiB"
        with pytest.raises(AnyformerError):  # the next request is refused the same way, and does not hang
            loaded.complete("again", max_new_tokens=2)
    if pid is not None:
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "the worker survived dispose"


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


@pytest.mark.safety("G16")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_anyformer_run_on_a_looping_template_fails_clearly_and_leaves_no_worker(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "loop-F32.gguf", chat_template=LOOP_TEMPLATE)
    started = time.monotonic()
    cli = subprocess.Popen(
        [sys.executable, "-m", "anyformer", "run", str(path), "hi", "--max-new-tokens", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    workers: set[int] = set()
    while cli.poll() is None and time.monotonic() - started < 60:
        workers |= _children(cli.pid)
        time.sleep(0.05)
    out, err = cli.communicate(timeout=5)
    elapsed = time.monotonic() - started
    assert cli.returncode not in (0, None), out
    assert "BAD_MODEL" in err and "chat template" in err and "Traceback" not in err, err
    assert elapsed < 30 + RENDER_SECONDS + HARD_STOP_GRACE_SECONDS, f"{elapsed:.1f} s"
    time.sleep(0.5)
    assert not [pid for pid in workers if _alive(pid)], "a worker outlived anyformer run"


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "worker"])
def test_a_prompt_longer_than_the_context_can_hold_is_refused_before_it_is_tokenized(
    tmp_path: Path, isolate: bool
) -> None:
    path = write_tiny_llama(tmp_path / "tiny-F32.gguf", context=512)
    with anyformer.load(path, backend="llamacpp", isolate=isolate) as loaded:
        with pytest.raises(AnyformerError) as caught:
            loaded.complete("word " * 400_000, max_new_tokens=2)  # 2 MB: far more than 512 tokens hold
        assert caught.value.code is ErrorCode.BAD_REQUEST
        assert "characters, more than the model's context can hold" in caught.value.message
        assert loaded.complete("hi", max_new_tokens=2).text is not None  # the model is unharmed
