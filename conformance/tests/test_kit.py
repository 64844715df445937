"""Self-tests of the conformance kit: a correct in-process backend passes, each broken one fails its test.

Each case writes a test module holding an in-process ``echo`` backend (it streams the alphabet)
with one defect switched on, runs it with ``pytester``, and checks that the kit test meant to catch
that defect fails with its observed-vs-expected message. A kit test that cannot fail is a defect.
"""

from __future__ import annotations

import pytest

from anyformer_conformance.base import MALFORMED_MESSAGES, BackendConformance, run_tests_skip_reason

ECHO_BACKEND = """
import socket

import anyformer
import pytest
from anyformer import AnyformerError, Chunk, Estimate, ProgressEvent, Refusal, StoreEntry, Verdict, hookimpl
from anyformer.plugin import BackendModel, Features, anyformer_home
from anyformer_conformance import BackendConformance, RefusalCase

pytest_plugins = {plugins!r}

BROKEN = {broken!r}
LETTERS = "abcdefghijklmnopqrstuvwxyz"


class EchoHandle(BackendModel):
    features = Features(run_progress=True)

    def __init__(self):
        self.backend = "echo"
        self.task = "text-generation"
        self.calls = 0
        self.disposed = False

    def run(self, input, progress=None, **options):
        # Upper-cases the texts one by one, reporting each (a run with progress and cancel).
        done = []
        total = len(input) - 1 if "progress-overshoots" in BROKEN else len(input)
        for text in input:
            done.append(text.upper())
            try:
                progress(ProgressEvent(stage="echo", done=len(done), total=total))
            except AnyformerError:
                if "swallows-cancel" not in BROKEN:
                    raise
                break
        return done

    def generate(self, messages, options):
        if options.temperature > 0:
            raise AnyformerError("BAD_REQUEST", "echo decodes greedily only: temperature must be 0")
        for message in messages:
            blocks = message["content"] if isinstance(message["content"], list) else []
            if "ignores-images" not in BROKEN and any(b["type"] == "image" for b in blocks):
                raise AnyformerError("BAD_REQUEST", "echo reads text only")
        return self._stream(messages, options)

    def _stream(self, messages, options):
        offset = len(str(messages[-1]["content"]))
        if "leaks" in BROKEN:
            offset += self.calls
            self.calls += 1
        for index in range(options.max_new_tokens):
            if options.cancel.is_set():
                yield Chunk(tokens=index, finish_reason="cancelled")
                return
            tokens = 1 if "decreasing-tokens" in BROKEN and index == 4 else index + 1
            yield Chunk(delta=LETTERS[(offset + index) % 26], tokens=tokens)
        yield Chunk(tokens=options.max_new_tokens, finish_reason="length")

    def dispose(self):
        if self.disposed and "dispose-twice-raises" in BROKEN:
            raise RuntimeError("already disposed")
        self.disposed = True


class EchoBackend:
    @hookimpl
    def can_run(self, model, caps, request):
        entry = model.file("echo.txt")
        if "raises-in-can-run" in BROKEN:
            raise RuntimeError("boom")
        if "opens-files" in BROKEN and entry is not None and entry.path:
            try:
                open(entry.path, "rb").close()
            except OSError:
                pass
        if "connects" in BROKEN:
            try:
                socket.create_connection(("huggingface.co", 443), timeout=1)
            except OSError:
                pass
        if entry is None:
            return Verdict.refuse("echo", Refusal.FORMAT, "no echo.txt in the repo")
        if (request.task or model.task or "text-generation") != "text-generation":
            return Verdict.refuse("echo", Refusal.TASK, "echo runs text-generation only")
        need = 1000
        if caps.ram_bytes < need:
            given = 1 if "low-need" in BROKEN else need
            reason = f"needs {{need}} bytes, {{caps.ram_bytes}} available"
            return Verdict.refuse("echo", Refusal.MEMORY, reason, need=given)
        return Verdict.accept("echo", Estimate(ram_bytes=need))

    @hookimpl
    def load(self, model, request, progress):
        return EchoHandle()

    @hookimpl
    def store_list(self):
        backend = "other" if "wrong-store-backend" in BROKEN else "echo"
        root = anyformer_home() / "echo"
        files = sorted(root.glob("*/echo.txt")) if root.is_dir() else []
        return [StoreEntry(backend=backend, repo=p.parent.name, revision=None, path=str(p), bytes=5) for p in files]


class TestEcho(BackendConformance):
    backend_id = {backend_id!r}
    supports_sampling = False
    refusal_cases = [
        RefusalCase(
            {{"repo": "x/y", "files": [{{"name": "echo.txt", "size": 5}}]}},
            {{"ram_bytes": 500}},
            {{}},
            "memory",
        ),
        RefusalCase({{"repo": "x/y", "files": [{{"name": "model.gguf", "size": 5}}]}}, {{}}, {{}}, Refusal.FORMAT),
    ]

    @pytest.fixture(scope="class")
    @classmethod
    def sample_model(cls, tmp_path_factory):
        folder = tmp_path_factory.mktemp("echo")
        (folder / "echo.txt").write_text("hello", encoding="utf-8")
        return anyformer.describe(folder)

    @pytest.fixture(scope="class")
    @classmethod
    def run_sample(cls):
        return (["a", "b", "c"], {{}})

    @pytest.fixture
    def stored_model(self, empty_anyformer_home):
        target = empty_anyformer_home / "echo" / "stored" / "echo.txt"
        target.parent.mkdir(parents=True)
        target.write_text("hello", encoding="utf-8")
        return target
{plugin_manager}{extra}
"""

IN_PROCESS_PLUGIN = """
    @pytest.fixture(scope="class")
    @classmethod
    def backend_plugin(cls):
        return EchoBackend()
"""

KIT_PLUGINS = ["anyformer_conformance.plugin"]
#: Options of every inner run: hypothesis's plugin (when installed) spends seconds on each session's summary.
INNER_ARGS = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")
#: Every item the kit collects for a backend: its tests, the malformed-messages one once per kind.
KIT_ITEMS = sum(name.startswith("test") for name in vars(BackendConformance)) - 1 + len(MALFORMED_MESSAGES)
#: The kit tests an in-process one-stream backend skips: the isolated worker and the fresh-interpreter
#: probe load backends from entry points only, and the tests of several streams at once need a handle
#: that declares ``parallel`` > 1.
IN_PROCESS_SKIPS = 2 + sum(name.startswith("test") and "parallel" in name for name in vars(BackendConformance))
#: The structured-output tests, which skip for a handle that does not honour ``constraint`` (as the echo backend).
CONSTRAINT_ITEMS = sum(name.startswith("test") and "constraint" in name for name in vars(BackendConformance))


def write_echo_tests(
    pytester: pytest.Pytester,
    *broken: str,
    extra: str = "",
    backend_id: str = "echo",
    in_process: bool = True,
    plugins: list[str] = KIT_PLUGINS,
) -> None:
    source = ECHO_BACKEND.format(
        plugins=plugins,
        broken=broken,
        backend_id=backend_id,
        plugin_manager=IN_PROCESS_PLUGIN if in_process else "",
        extra=extra,
    )
    pytester.makepyfile(test_echo=source)


def test_a_correct_backend_passes_every_kit_test(pytester: pytest.Pytester) -> None:
    write_echo_tests(pytester)
    result = pytester.runpytest(*INNER_ARGS, "-rs")
    skips = IN_PROCESS_SKIPS + CONSTRAINT_ITEMS
    result.assert_outcomes(passed=KIT_ITEMS - skips, skipped=skips)
    result.stdout.fnmatch_lines(["*registered in-process: an isolated worker loads backends from entry points*"])


@pytest.mark.parametrize(
    ("defect", "kit_test", "message"),
    [
        ("decreasing-tokens", "test_backend_stream_is_well_formed", "tokens went 4 -> 1, but must never decrease"),
        (
            "low-need",
            "test_need_only_on_budget_and_memory_refusals",
            "refusal must need more than the 500 bytes offered",
        ),
        ("opens-files", "test_can_run_reads_no_weights_and_opens_no_connection", "can_run opened"),
        ("connects", "test_can_run_reads_no_weights_and_opens_no_connection", "can_run tried to connect"),
        ("raises-in-can-run", "test_sample_verdict_is_ok_and_well_formed", "can_run did not answer"),
        ("leaks", "test_no_text_leaks_into_the_next_call", "prompt A after prompt B"),
        ("leaks", "test_greedy_is_repeatable", "the second greedy answer"),
        ("ignores-images", "test_image_blocks_follow_supports_images", "before any error"),
        (
            "wrong-store-backend",
            "test_store_list_entries_are_well_formed",
            "entry.backend is 'other', expected 'echo'",
        ),
        ("dispose-twice-raises", "test_dispose_twice_and_the_with_block", "second dispose() raised"),
        (
            "progress-overshoots",
            "test_run_progress_events_are_well_formed",
            "has done=3 of total=2, expected done <= total",
        ),
        (
            "swallows-cancel",
            "test_run_cancelled_after_the_first_event",
            "expected the AnyformerError(CANCELLED) to propagate",
        ),
    ],
)
def test_a_broken_backend_fails_the_kit_test_for_its_defect(
    pytester: pytest.Pytester, defect: str, kit_test: str, message: str
) -> None:
    write_echo_tests(pytester, defect)
    result = pytester.runpytest(*INNER_ARGS, "-k", kit_test)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*{message}*"])


def test_an_override_without_xfail_is_a_collection_error_naming_the_test(pytester: pytest.Pytester) -> None:
    override = """
    def test_greedy_is_repeatable(self, loaded_model):
        pass
"""
    write_echo_tests(pytester, extra=override)
    result = pytester.runpytest(*INNER_ARGS)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*TestEcho.test_greedy_is_repeatable overrides a standard conformance test without*xfail*"]
    )


def test_an_xfail_without_a_reason_does_not_count(pytester: pytest.Pytester) -> None:
    override = """
    @pytest.mark.xfail
    def test_greedy_is_repeatable(self, loaded_model):
        pass
"""
    write_echo_tests(pytester, extra=override)
    result = pytester.runpytest(*INNER_ARGS)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*TestEcho.test_greedy_is_repeatable overrides*"])


def test_an_override_marked_xfail_with_a_reason_is_allowed(pytester: pytest.Pytester) -> None:
    override = """
    @pytest.mark.xfail(reason="the echo engine repeats by design", strict=True)
    def test_greedy_is_repeatable(self, loaded_model):
        raise AssertionError("a known failure")
"""
    write_echo_tests(pytester, extra=override)
    result = pytester.runpytest(*INNER_ARGS)
    skips = IN_PROCESS_SKIPS + CONSTRAINT_ITEMS
    result.assert_outcomes(passed=KIT_ITEMS - 1 - skips, skipped=skips, xfailed=1)


def test_a_backend_that_is_not_installed_fails_with_the_fix(pytester: pytest.Pytester) -> None:
    write_echo_tests(pytester, backend_id="no-such-backend-7c1e", in_process=False)
    result = pytester.runpytest(*INNER_ARGS, "-k", "test_can_run_refuses_a_foreign_format")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*no entry point named 'no-such-backend-7c1e' in the 'anyformer' group*"])


def test_forgetting_the_plugin_line_fails_with_the_fix(pytester: pytest.Pytester) -> None:
    write_echo_tests(pytester, plugins=[])
    result = pytester.runpytest(*INNER_ARGS, "-k", "test_can_run_refuses_a_foreign_format")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*plugin is not active: add pytest_plugins = *anyformer_conformance.plugin*"])


@pytest.mark.parametrize(
    ("sample", "run_sample", "reason"),
    [
        (None, None, "no sample_model and no run_sample: the run tests need both"),
        ("a model", None, "no run_sample (only sample_model is supplied): the run tests need both"),
        (None, (["x"], {}), "no sample_model (only run_sample is supplied): the run tests need both"),
        ("a model", (["x"], {}), None),
    ],
)
def test_the_run_tests_skip_naming_the_fixture_that_is_missing(sample: object, run_sample: object, reason: str) -> None:
    assert run_tests_skip_reason(sample, run_sample) == reason
