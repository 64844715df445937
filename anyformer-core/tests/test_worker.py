"""Isolated workers (``load(..., isolate=True)``): the same contract, and an engine crash ends only the worker.

The backends are :mod:`worker_engines`, installed as entry points of a distribution on
``sys.path``; the worker takes the parent's ``sys.path`` and loads them from there.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import worker_engines

import anyformer
from anyformer import AnyformerError, Caps, Chunk, ErrorCode
from anyformer.isolation._worker_protocol import (
    MAX_FRAME_BYTES,
    ProtocolError,
    crash_error,
    decode_value,
    encode_value,
    read_frame,
    write_frame,
)
from anyformer.isolation._worker_session import WINDOW


@pytest.fixture
def engines(distributions: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """:mod:`worker_engines` installed as the distribution ``aftest-engines``, and only those backends."""
    distributions.add("aftest-engines", "1.0", worker_engines.ENTRY_POINTS)
    monkeypatch.setenv("ANYFORMER_PLUGINS", ",".join(worker_engines.ENTRY_POINTS))
    return distributions


@pytest.fixture
def load_isolated(engines: Any, model_description: dict[str, Any]) -> Iterator[Callable[..., Any]]:
    """Load the test model on one of the engines in a worker; every worker is disposed afterwards."""
    opened: list[anyformer.Loaded] = []

    def load(backend: str, **options: Any) -> anyformer.Loaded:
        loaded = anyformer.load(
            model_description, backend=backend, caps=Caps(ram_bytes=16 * 2**30), isolate=True, **options
        )
        opened.append(loaded)
        return loaded

    yield load
    for loaded in opened:
        loaded.dispose()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stats(loaded: anyformer.Loaded) -> dict[str, int]:
    return loaded.run("stats")


# ---- the same contract -----------------------------------------------------------------------------


def test_the_engine_runs_in_another_process(load_isolated: Any) -> None:
    loaded = load_isolated("steady")
    assert loaded.isolated and loaded.worker_pid not in (None, os.getpid())
    assert _stats(loaded)["pid"] == loaded.worker_pid
    assert f"worker pid {loaded.worker_pid}" in repr(loaded)
    with pytest.raises(AnyformerError) as caught:
        _ = loaded.handle
    assert caught.value.code is ErrorCode.BAD_REQUEST and "isolate=False" in caught.value.message


def test_isolated_and_in_process_streams_are_identical(load_isolated: Any, model_description: dict[str, Any]) -> None:
    isolated = load_isolated("steady")
    with anyformer.load(model_description, backend="steady", caps=Caps(ram_bytes=16 * 2**30)) as local:
        assert not local.isolated and local.worker_pid is None
        for options in ({"max_new_tokens": 5}, {"max_new_tokens": 50, "stop": "w4"}, {"max_new_tokens": 40}):
            assert list(isolated.generate("hi", **options)) == list(local.generate("hi", **options))


def test_previews_cross_from_the_worker(load_isolated: Any, model_description: dict[str, Any]) -> None:
    isolated = load_isolated("previews")
    with anyformer.load(model_description, backend="previews", caps=Caps(ram_bytes=16 * 2**30)) as local:
        streamed = list(isolated.generate("hi", max_new_tokens=4))
        assert streamed == list(local.generate("hi", max_new_tokens=4))
    assert [c.preview for c in streamed] == ["w1 w2?", "w2 w3?", "w3 w4?", None]


def test_a_prompt_that_opens_think_in_the_worker_is_noted_in_the_parent(
    load_isolated: Any, model_description: dict[str, Any]
) -> None:
    """The backend renders at its first token (lazily), in the worker: the parent's chunks still say so."""
    isolated = load_isolated("thinks")
    with anyformer.load(model_description, backend="thinks", caps=Caps(ram_bytes=16 * 2**30)) as local:
        for loaded in (isolated, local):
            thinking = list(loaded.generate("hi", max_new_tokens=3, thinking=True))
            plain = list(loaded.generate("hi", max_new_tokens=3))
            assert all(chunk.thinking_opened for chunk in thinking) and len(thinking) == 3
            assert not any(chunk.thinking_opened for chunk in plain)


def test_messages_with_bytes_reach_the_worker_intact(load_isolated: Any) -> None:
    loaded = load_isolated("echo")
    blocks = [{"type": "text", "text": "what is it?"}, {"type": "image", "image": b"\x89PNG\x00\xff"}]
    text = loaded.complete([{"role": "user", "content": blocks}]).text
    assert "b'\\x89PNG\\x00\\xff'" in text and "what is it?" in text


def test_audio_blocks_reach_a_worker_whose_handle_reads_audio(load_isolated: Any) -> None:
    loaded = load_isolated("echo")
    assert loaded.audio_input
    samples = np.linspace(-0.5, 0.5, 5, dtype=np.float32)
    blocks = [{"type": "audio", "audio": {"raw": samples, "sampling_rate": 16000}}, {"type": "text", "text": "?"}]
    text = loaded.complete([{"role": "user", "content": blocks}]).text
    assert "'sampling_rate': 16000" in text and "-0.5" in text and "0.25" in text


def test_audio_blocks_are_refused_for_a_worker_whose_handle_reads_none(load_isolated: Any) -> None:
    loaded = load_isolated("steady")
    assert not loaded.audio_input
    with pytest.raises(AnyformerError) as caught:
        loaded.complete([{"role": "user", "content": [{"type": "audio", "audio": b"RIFF"}]}])
    assert caught.value.code is ErrorCode.BAD_REQUEST and "audio" in caught.value.message


def test_progress_of_the_load_reaches_the_caller(engines: Any, model_description: dict[str, Any]) -> None:
    events: list[anyformer.ProgressEvent] = []
    with anyformer.load(
        model_description, backend="steady", caps=Caps(ram_bytes=16 * 2**30), isolate=True, progress=events.append
    ):
        pass
    assert [(e.stage, e.done, e.total) for e in events] == [("load", 0, 2), ("load", 2, 2)]


def test_run_crosses_with_its_options(load_isolated: Any) -> None:
    loaded = load_isolated("steady")
    assert loaded.run("text", normalize=True) == {"input": "text", "options": {"normalize": True}}
    with pytest.raises(AnyformerError) as caught:
        loaded.run(object())
    assert caught.value.code is ErrorCode.BAD_REQUEST and "isolated worker" in caught.value.message


def test_an_option_that_is_not_data_is_bad_request(load_isolated: Any) -> None:
    loaded = load_isolated("steady")
    with pytest.raises(AnyformerError) as caught:
        loaded.generate("hi", logits_processor=lambda x: x)
    assert caught.value.code is ErrorCode.BAD_REQUEST
    assert loaded.complete("hi", max_new_tokens=2).text == "w1 w2 "


@pytest.mark.safety("R1")
def test_cancel_stops_the_worker_within_two_chunks(load_isolated: Any) -> None:
    loaded = load_isolated("slow")
    cancel = threading.Event()
    seen: list[Chunk] = []
    after_cancel = 0
    for chunk in loaded.generate("hi", max_new_tokens=10**6, cancel=cancel):
        seen.append(chunk)
        after_cancel += cancel.is_set()
        if len(seen) == 3:
            cancel.set()
    assert after_cancel <= 2 and seen[-1].finish_reason == "cancelled"
    stats = _stats(loaded)
    assert stats["closed"] == 1, "the engine's iterator was not closed in the worker"
    assert stats["made"] <= 3 + WINDOW
    time.sleep(0.1)
    assert _stats(loaded)["made"] == stats["made"], "the engine kept working after the cancel"
    assert loaded.complete("again", max_new_tokens=2).text == "w1 w2 "


@pytest.mark.safety("R1", "R3")
def test_closing_the_iterator_stops_the_worker(load_isolated: Any) -> None:
    loaded = load_isolated("slow")
    stream = loaded.generate("hi", max_new_tokens=10**6)
    next(stream)
    next(stream)
    stream.close()
    assert loaded.complete("again", max_new_tokens=3).text == "w1 w2 w3 "
    stats = _stats(loaded)
    assert stats["closed"] == 2 and stats["made"] <= 2 + WINDOW + 3


@pytest.mark.safety("R1")
def test_cancel_while_the_engine_is_between_tokens_returns_at_once(load_isolated: Any) -> None:
    loaded = load_isolated("slow")
    cancel = threading.Event()
    threading.Timer(0.05, cancel.set).start()
    started = time.monotonic()
    last = loaded.complete("hi", max_new_tokens=10**6, cancel=cancel)
    assert last.finish_reason == "cancelled" and time.monotonic() - started < 2


@pytest.mark.safety("R2")
def test_a_second_generate_while_one_is_open_is_busy(load_isolated: Any) -> None:
    loaded = load_isolated("steady")
    first = loaded.generate("hi")
    next(first)
    with pytest.raises(AnyformerError) as caught:
        loaded.generate("again")
    assert caught.value.code is ErrorCode.BUSY
    assert next(first).text == "w1 w2 "
    first.close()


def test_agenerate_through_a_worker(load_isolated: Any) -> None:
    loaded = load_isolated("steady")

    async def collect() -> list[Chunk]:
        return [chunk async for chunk in loaded.agenerate("hi", max_new_tokens=4)]

    assert [c.text for c in asyncio.run(collect())][-1] == "w1 w2 w3 w4 "


@pytest.mark.safety("R3")
def test_dispose_ends_the_worker_and_twice_is_harmless(load_isolated: Any) -> None:
    loaded = load_isolated("slow")
    pid = loaded.worker_pid
    stream = loaded.generate("hi", max_new_tokens=1000)
    next(stream)
    loaded.dispose()
    loaded.dispose()
    assert not _alive(pid)
    with pytest.raises(StopIteration):
        next(stream)
    with pytest.raises(AnyformerError) as caught:
        loaded.generate("hi")
    assert caught.value.code is ErrorCode.BAD_REQUEST


@pytest.mark.safety("R3")
def test_a_dropped_loaded_model_ends_its_worker(engines: Any, model_description: dict[str, Any]) -> None:
    loaded = anyformer.load(model_description, backend="steady", caps=Caps(ram_bytes=16 * 2**30), isolate=True)
    pid = loaded.worker_pid
    del loaded
    import gc

    gc.collect()
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(pid)


def test_stdout_writes_in_the_engine_do_not_corrupt_the_stream(load_isolated: Any) -> None:
    assert load_isolated("prints").complete("hi", max_new_tokens=4).text == "w1 w2 w3 w4 "


# ---- errors raised in the worker come back with their code ------------------------------------


@pytest.mark.parametrize(
    ("backend", "code", "words"),
    [
        ("bad-model-at-load", ErrorCode.BAD_MODEL, "wrong shape"),
        ("raises-at-load", ErrorCode.PLUGIN_ERROR, "KeyError"),
    ],
)
def test_errors_at_load_come_back_with_their_code(
    engines: Any, load_isolated: Any, backend: str, code: ErrorCode, words: str
) -> None:
    with pytest.raises(AnyformerError) as caught:
        load_isolated(backend)
    assert caught.value.code is code and words in caught.value.message


def test_errors_while_generating_come_back_with_their_code(load_isolated: Any) -> None:
    loaded = load_isolated("bad-request")
    with pytest.raises(AnyformerError) as caught:
        loaded.generate("hi")
    assert caught.value.code is ErrorCode.BAD_REQUEST and "9000 tokens" in caught.value.message
    loaded = load_isolated("raises")
    with pytest.raises(AnyformerError) as caught:
        list(loaded.generate("hi"))
    assert caught.value.code is ErrorCode.PLUGIN_ERROR and "KeyError" in caught.value.message
    assert loaded.complete("hi", max_new_tokens=2).text == "w1 w2 ", "the worker survives an exception"


def test_a_backend_registered_in_process_cannot_be_isolated(model_description: dict[str, Any]) -> None:
    manager = anyformer.PluginManager()
    manager.register(worker_engines.steady, "steady")
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(model_description, caps=Caps(ram_bytes=16 * 2**30), plugins=manager, isolate=True)
    assert caught.value.code is ErrorCode.BAD_REQUEST and "entry point" in caught.value.message


# ---- a crashing engine ends only the worker (SAFETY R5, R6) -------------------------------------


@pytest.mark.safety("R6")
@pytest.mark.parametrize(
    ("backend", "how"),
    [("aborts", "killed by SIGABRT"), ("segfaults", "killed by SIGSEGV"), ("exits", "exited with status 7")],
)
def test_an_engine_crash_mid_generation_is_backend_crashed_and_the_caller_lives(
    load_isolated: Any, backend: str, how: str
) -> None:
    loaded = load_isolated(backend)
    pid = loaded.worker_pid
    seen: list[Chunk] = []
    with pytest.raises(AnyformerError) as caught:
        for chunk in loaded.generate("hi", max_new_tokens=100):
            seen.append(chunk)
    error = caught.value
    assert error.code is ErrorCode.BACKEND_CRASHED, error
    assert how in error.message and f"pid {pid}" in error.message
    fault = {"aborts": "abort", "segfaults": "segfault", "exits": "exit"}[backend]
    assert f"engine: about to {fault}" in error.message, "the engine's last stderr line is quoted"
    assert "out of memory" not in error.message
    assert [c.text for c in seen] == ["w1 ", "w1 w2 "]
    assert not _alive(pid)
    with pytest.raises(AnyformerError) as again:
        loaded.generate("hi")
    assert again.value.code is ErrorCode.BACKEND_CRASHED
    loaded.dispose()
    assert load_isolated("steady").complete("hi", max_new_tokens=2).text == "w1 w2 ", "a fresh load works"


@pytest.mark.safety("R6")
def test_a_worker_killed_mid_generation_is_backend_crashed_then_a_fresh_load_works(load_isolated: Any) -> None:
    loaded = load_isolated("slow")
    with pytest.raises(AnyformerError) as caught:
        for chunk in loaded.generate("hi", max_new_tokens=10**6):
            if chunk.tokens == 5:
                os.kill(loaded.worker_pid, signal.SIGKILL)
    assert caught.value.code is ErrorCode.BACKEND_CRASHED
    assert "killed by SIGKILL" in caught.value.message
    assert load_isolated("slow").complete("hi", max_new_tokens=3).text == "w1 w2 w3 "


@pytest.mark.safety("R6")
@pytest.mark.parametrize(("backend", "line"), [("bad-alloc", "std::bad_alloc"), ("cuda-oom", "CUDA error: out of")])
def test_out_of_memory_during_compute_is_recognised_from_stderr(load_isolated: Any, backend: str, line: str) -> None:
    loaded = load_isolated(backend)
    with pytest.raises(AnyformerError) as caught:
        list(loaded.generate("hi"))
    assert caught.value.code is ErrorCode.BACKEND_CRASHED
    assert "SIGABRT while generating: out of memory" in caught.value.message and line in caught.value.message


@pytest.mark.safety("R5")
def test_out_of_memory_while_loading_is_out_of_memory(engines: Any, load_isolated: Any) -> None:
    with pytest.raises(AnyformerError) as caught:
        load_isolated("bad-alloc-at-load")
    assert caught.value.code is ErrorCode.OUT_OF_MEMORY and "while loading: out of memory" in caught.value.message
    assert load_isolated("steady").complete("hi", max_new_tokens=1).text == "w1 "


@pytest.mark.safety("R6")
def test_an_abort_while_loading_is_backend_crashed(engines: Any, load_isolated: Any) -> None:
    with pytest.raises(AnyformerError) as caught:
        load_isolated("aborts-at-load")
    assert caught.value.code is ErrorCode.BACKEND_CRASHED and "SIGABRT while loading" in caught.value.message


@pytest.mark.safety("R6")
def test_a_sigkill_while_the_oom_kill_count_rose_is_out_of_memory() -> None:
    error = crash_error("llamacpp", 42, "generating", -signal.SIGKILL, [], oom_kills_before=3, oom_kills_after=4)
    assert error.code is ErrorCode.BACKEND_CRASHED and "OOM killer" in error.message
    assert "out of memory" in error.message
    plain = crash_error("llamacpp", 42, "generating", -signal.SIGKILL, [], oom_kills_before=3, oom_kills_after=3)
    assert "out of memory" not in plain.message and "kill -9" in plain.message
    loading = crash_error("llamacpp", 42, "loading", -signal.SIGKILL, [], oom_kills_before=0, oom_kills_after=1)
    assert loading.code is ErrorCode.OUT_OF_MEMORY


@pytest.mark.parametrize(
    "line",
    [
        "ggml_vulkan: vk::Device::allocateMemory: ErrorOutOfDeviceMemory",
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 5000.00 MiB on device 0: cudaMalloc failed",
        "mmap failed: Cannot allocate memory",
        "MemoryError",
    ],
)
def test_out_of_memory_lines_of_the_engines_are_recognised(line: str) -> None:
    error = crash_error("x", 1, "generating", -signal.SIGABRT, ["noise", line, "Fatal Python error: Aborted"])
    assert "out of memory" in error.message


def test_an_ordinary_abort_is_not_out_of_memory() -> None:
    tail = ["GGML_ASSERT(ggml_nelements(a) == ne0*ne1) failed", "Fatal Python error: Aborted"]
    error = crash_error("x", 1, "generating", -signal.SIGABRT, tail)
    assert "out of memory" not in error.message and "GGML_ASSERT" in error.message


def test_the_worker_ends_when_its_parent_dies(engines: Any, tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import os, sys, anyformer
        from anyformer import Caps
        loaded = anyformer.load(sys.argv[1], backend="slow", caps=Caps(ram_bytes=16 * 2**30), isolate=True)
        print(loaded.worker_pid, flush=True)
        os._exit(0)
        """
    )
    description = tmp_path / "model.json"
    description.write_text('{"repo": "t/m", "files": [{"name": "m.gguf", "size": 1}]}')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(engines.root), str(Path(worker_engines.__file__).parent)])}
    done = subprocess.run(
        [sys.executable, "-c", script, str(description)], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the worker outlived its parent"


def test_a_cancel_while_the_engine_prepares_the_prompt_returns_at_once(
    load_isolated: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import anyformer.isolation._worker_session as worker_session

    monkeypatch.setattr(worker_session, "SETTLE_SECONDS", 1.0)  # dispose ends the stuck worker sooner
    loaded = load_isolated("spins")
    cancel = threading.Event()
    results: list[Any] = []
    caller = threading.Thread(target=lambda: results.append(list(loaded.generate("hi", cancel=cancel))), daemon=True)
    caller.start()
    time.sleep(0.3)  # the engine spins before its first token, deaf to the cancel
    cancel.set()
    caller.join(3)
    assert not caller.is_alive(), "the caller waited for an engine that never answers"
    assert all(not chunk.delta for chunk in results[0])
    pid = loaded.worker_pid
    loaded.dispose()
    assert not _alive(pid), "dispose left the stuck worker running"


@pytest.mark.safety("H3")
def test_a_generation_that_never_settles_makes_the_next_call_busy_and_the_worker_lives(
    load_isolated: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import anyformer.isolation._worker_session as worker_session

    monkeypatch.setattr(worker_session, "SETTLE_SECONDS", 0.5)
    loaded = load_isolated("spins")
    cancel = threading.Event()
    caller = threading.Thread(target=lambda: list(loaded.generate("hi", cancel=cancel)), daemon=True)
    caller.start()
    time.sleep(0.3)  # the engine spins before its first token, deaf to the cancel
    cancel.set()
    caller.join(3)
    pid = loaded.worker_pid
    with caplog.at_level("ERROR", logger="anyformer.isolation"):
        with pytest.raises(AnyformerError) as caught:
            list(loaded.generate("again"))
    assert caught.value.code is ErrorCode.BUSY, caught.value
    assert _alive(pid), "a settle timeout ended the worker (and every stream it served)"
    assert any("bug in the backend" in record.getMessage() for record in caplog.records)
    loaded.dispose()
    assert not _alive(pid), "dispose left the stuck worker running"


_SPINNING_PARENT = """
import os, sys, threading, anyformer
from anyformer import Caps
loaded = anyformer.load(sys.argv[1], backend="spins", caps=Caps(ram_bytes=16 * 2**30), isolate=True)
print(loaded.worker_pid, flush=True)
loaded.complete("hi")  # the engine spins for ever before its first token
"""


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("signal_number", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_worker_busy_in_its_engine_ends_when_its_parent_is_killed(
    engines: Any, tmp_path: Path, signal_number: int
) -> None:
    description = tmp_path / "model.json"
    description.write_text('{"repo": "t/m", "files": [{"name": "m.gguf", "size": 1}]}')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(engines.root), str(Path(worker_engines.__file__).parent)])}
    parent = subprocess.Popen(
        [sys.executable, "-c", _SPINNING_PARENT, str(description)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        deadline = time.monotonic() + 20
        while _cpu_seconds(pid) < 0.3 and time.monotonic() < deadline:  # it is in the engine, spinning
            time.sleep(0.05)
        parent.send_signal(signal_number)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = _alive(pid)
        if alive:
            os.kill(pid, signal.SIGKILL)
        assert not alive, "the worker outlived its parent, spinning"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


# ---- the protocol ----------------------------------------------------------------------------------


def _pipe_with(data: bytes) -> int:
    read_end, write_end = os.pipe()
    os.write(write_end, data)
    os.close(write_end)
    return read_end


@pytest.mark.parametrize(
    ("data", "fault"),
    [
        ((MAX_FRAME_BYTES + 1).to_bytes(4, "big"), "over the"),
        (b"\x00\x00\x00\x05{bad}", "not JSON"),
        (b"\x00\x00\x00\x02[]", "not an object"),
        (b'\x00\x00\x00\x09{"op": 1}', "not an object"),
        (b'\x00\x00\x00\x10{"op"', "ended"),
        (b"\x00\x00", "ended"),
    ],
)
def test_malformed_frames_are_protocol_errors(data: bytes, fault: str) -> None:
    fd = _pipe_with(data)
    try:
        with pytest.raises(ProtocolError, match=fault):
            read_frame(fd)
    finally:
        os.close(fd)


def test_frames_round_trip_and_end_cleanly() -> None:
    read_end, write_end = os.pipe()
    write_frame(write_end, {"op": "chunks", "items": [["ü", 1, None]]})
    os.close(write_end)
    assert read_frame(read_end) == {"op": "chunks", "items": [["ü", 1, None]]}
    assert read_frame(read_end) is None
    os.close(read_end)


def test_values_that_are_not_json_cross_encoded() -> None:
    import numpy as np

    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    value = decode_value(encode_value({"b": b"\x00\x01", "a": array, "n": [1, "x", None]}))
    assert value["b"] == b"\x00\x01" and value["n"] == [1, "x", None]
    assert value["a"].dtype == np.float32 and value["a"].tolist() == array.tolist()
    with pytest.raises(ProtocolError):
        decode_value({"$array": {"dtype": "O", "shape": [1], "data": ""}})
    with pytest.raises(TypeError):
        encode_value({1, 2})


# ---- the CLI runs engines in a worker by default ---------------------------------------------------


def _cli_env(engines: Any) -> dict[str, str]:
    tests = str(Path(worker_engines.__file__).parent)
    return {"PYTHONPATH": os.pathsep.join([str(engines.root), tests]), "ANYFORMER_PLUGINS": "aborts,steady"}


@pytest.mark.safety("R6")
def test_cli_run_reports_an_engine_crash_without_dying_of_it(engines: Any, run_cli: Any, tmp_path: Path) -> None:
    description = tmp_path / "model.json"
    description.write_text('{"repo": "t/m", "files": [{"name": "m.gguf", "size": 1}]}')
    done = run_cli("run", str(description), "hi", "--backend", "aborts", "--caps", "", env=_cli_env(engines))
    assert done.returncode == 1, done.stderr
    assert "BACKEND_CRASHED" in done.stderr and "killed by SIGABRT" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_run_in_process_is_an_opt_out(engines: Any, run_cli: Any, tmp_path: Path) -> None:
    description = tmp_path / "model.json"
    description.write_text('{"repo": "t/m", "files": [{"name": "m.gguf", "size": 1}]}')
    args = ("run", str(description), "hi", "--backend", "steady", "--caps", "", "--max-new-tokens", "3")
    isolated = run_cli(*args, env=_cli_env(engines))
    in_process = run_cli(*args, "--in-process", env=_cli_env(engines))
    assert isolated.returncode == in_process.returncode == 0, isolated.stderr + in_process.stderr
    assert isolated.stdout == in_process.stdout == "w1 w2 w3 \n"
    crashed = run_cli(
        "run", str(description), "hi", "--backend", "aborts", "--caps", "", "--in-process", env=_cli_env(engines)
    )
    assert crashed.returncode == -6, "in-process, the abort takes the CLI down with it"


# ---- the worker starts while the parent describes and selects --------------------------------------


@pytest.fixture
def started_workers(monkeypatch: pytest.MonkeyPatch) -> list[subprocess.Popen[bytes]]:
    """Every worker process ``load`` starts ahead of selection."""
    from anyformer.isolation import _worker_session

    started: list[subprocess.Popen[bytes]] = []
    real = _worker_session.start_worker_process

    def record() -> subprocess.Popen[bytes]:
        started.append(real())
        return started[-1]

    monkeypatch.setattr(_worker_session, "start_worker_process", record)
    return started


def test_the_worker_started_ahead_is_the_one_that_loads(load_isolated: Any, started_workers: list[Any]) -> None:
    loaded = load_isolated("steady")
    assert [process.pid for process in started_workers] == [loaded.worker_pid]


@pytest.mark.parametrize(
    ("ref", "backend", "code"),
    [
        ("/no/such/model.gguf", "steady", ErrorCode.MODEL_NOT_FOUND),  # describe fails
        (None, "no-such-backend", ErrorCode.BAD_REQUEST),  # the backend is not installed
    ],
)
def test_a_load_that_fails_before_the_worker_is_used_ends_it(
    engines: Any, model_description: dict[str, Any], started_workers: list[Any], ref: Any, backend: str, code: Any
) -> None:
    with pytest.raises(AnyformerError) as caught:
        anyformer.load(ref or model_description, backend=backend, caps=Caps(), isolate=True)
    assert caught.value.code is code
    assert len(started_workers) == 1
    assert started_workers[0].poll() is not None  # ended and reaped before load raised


def test_the_worker_takes_the_parents_validated_headers_into_its_cache(tmp_path: Path) -> None:
    from hostile_files import valid_gguf

    from anyformer import _api
    from anyformer.files import _gguf_header
    from anyformer.files._gguf_share import shared_headers
    from anyformer.isolation._worker import prepare

    model = tmp_path / "m.gguf"
    model.write_bytes(valid_gguf())
    assert _api._local_path(str(model)) == str(model)
    assert _api._local_path(tmp_path / "missing.gguf") is None
    assert _api._local_path("org/name") is None  # a Hub repo id: nothing local to share
    _gguf_header._HEADER_CACHE.clear()
    parsed = _gguf_header.read_gguf_header(model)
    entries = shared_headers(str(model))
    assert [entry["path"] for entry in entries] == [str(model)]
    assert shared_headers(str(tmp_path / "other.gguf")) == []
    _gguf_header._HEADER_CACHE.clear()
    prepare({"headers": entries})
    assert [key[0] for key in _gguf_header._HEADER_CACHE] == [str(model)]
    assert _gguf_header._HEADER_CACHE[next(iter(_gguf_header._HEADER_CACHE))][0] == parsed
    prepare({"headers": None})
    prepare({"headers": [{"path": str(model)}]})  # malformed: nothing adopted, nothing raised
    prepare({})


def test_an_isolated_load_of_a_local_gguf_hands_the_worker_its_headers(engines: Any, tmp_path: Path) -> None:
    from hostile_files import valid_gguf

    model = tmp_path / "m.gguf"
    model.write_bytes(valid_gguf())
    with anyformer.load(str(model), backend="steady", caps=Caps(ram_bytes=16 * 2**30), isolate=True) as loaded:
        # The test backend never reads the file: the header is in the worker's cache because it was handed over.
        assert loaded.run("cached headers") == [str(model)]


def test_a_model_given_as_a_description_shares_no_headers(
    load_isolated: Any, started_workers: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from anyformer import _api

    seen: list[str | None] = []
    real = _api._share_headers
    monkeypatch.setattr(_api, "_share_headers", lambda process, path: seen.append(path) or real(process, path))
    load_isolated("steady")
    assert seen == [None] and len(started_workers) == 1


# ---- the `anyformer` command starts its worker before it imports the rest -------------------------


def test_a_prestarted_worker_is_the_one_load_takes(load_isolated: Any) -> None:
    from anyformer.isolation import _worker_start

    _worker_start.prestart()
    prestarted = _worker_start._prestarted
    assert prestarted is not None
    loaded = load_isolated("steady")
    assert loaded.worker_pid == prestarted.pid
    assert _worker_start.take_prestarted() is None  # taken once


def test_a_prestarted_worker_nobody_takes_is_ended() -> None:
    from anyformer.isolation import _worker_start

    _worker_start.prestart()
    process = _worker_start._prestarted
    assert process is not None
    _worker_start.discard_prestarted()
    assert process.poll() is not None and _worker_start._prestarted is None


@pytest.mark.parametrize(
    ("argv", "isolated"),
    [
        (["run", "hi"], True),
        (["run", "m.gguf", "hi", "--max-new-tokens", "4"], True),
        (["run", "hi", "--in-process"], False),
        (["run", "--help"], False),
        (["check", "m.gguf"], False),
        ([], False),
    ],
)
def test_only_an_isolated_run_starts_its_worker_early(argv: list[str], isolated: bool) -> None:
    from anyformer.cli._main import runs_isolated

    assert runs_isolated(argv) is isolated


def test_a_run_refused_before_loading_ends_its_prestarted_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    from anyformer.cli._main import main
    from anyformer.isolation import _worker_start

    started: list[subprocess.Popen[bytes]] = []
    real = _worker_start.start_worker_process

    def record() -> subprocess.Popen[bytes]:
        started.append(real())
        return started[-1]

    monkeypatch.setattr(_worker_start, "start_worker_process", record)
    assert main(["run", "hi", "--max-new-tokens", "0"]) == 2  # BAD_REQUEST before any load
    assert len(started) == 1 and started[0].poll() is not None
