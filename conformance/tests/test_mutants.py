"""The kit's teeth: each mutant of the template backend fails the kit test for the rule it breaks.

Every case runs the kit (with pytest's ``pytester``) against one mutant from ``kit_mutants.py``,
selecting the kit test meant to catch it, and checks that it fails with the observed-vs-expected
message naming the rule. The same kit passes the unmutated wrapper and the installed template.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from anyformer_conformance.base import MALFORMED_MESSAGES, BackendConformance

HERE = Path(__file__).resolve().parent
#: Options of every inner run: hypothesis's plugin (when installed) spends seconds on each session's summary.
INNER_ARGS = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")
#: Every item the kit collects for a backend: its tests, the malformed-messages one once per kind.
KIT_ITEMS = sum(name.startswith("test") for name in vars(BackendConformance)) - 1 + len(MALFORMED_MESSAGES)
#: The structured-output tests, which skip for a handle that does not honour ``constraint``.
CONSTRAINT_ITEMS = sum(name.startswith("test") and "constraint" in name for name in vars(BackendConformance))
#: The items only a backend serving several streams at once runs (the others skip them).
PARALLEL_ITEMS = sum(name.startswith("test") and "parallel" in name for name in vars(BackendConformance))
#: The run progress and cancel items, which skip without a ``run_sample`` (the template generates text only).
RUN_ITEMS = sum(name.startswith("test_run_") for name in vars(BackendConformance))

MUTANT_MODULE = """
import pytest
from kit_mutants import mutant_kit

pytest_plugins = ["anyformer_conformance.plugin"]

TestMutant = mutant_kit({name!r})
"""

INSTALLED_MODULE = """
from kit_mutants import TemplateKit

pytest_plugins = ["anyformer_conformance.plugin"]


class TestInstalledTemplate(TemplateKit):
    pass
"""


def run_kit(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    """Run the kit from a test module holding ``source``, with ``kit_mutants`` importable."""
    pytester.syspathinsert(HERE)
    pytester.makepyfile(test_kit_run=source)
    return pytester.runpytest(*INNER_ARGS, *args)


@pytest.mark.parametrize(
    ("mutant", "kit_test", "message"),
    [
        (
            "ignores-max-new-tokens",
            "test_backend_stream_stops_at_max_new_tokens",
            "chunk 8 reports 9 tokens, but max_new_tokens is 8 (rule: the stream stops at max_new_tokens)*",
        ),
        (
            "ignores-cancel",
            "test_backend_stream_stops_when_cancelled",
            "* chunks came after cancel was set*expected at most 2*(rule: the backend stops when cancelled)*",
        ),
        (
            "tokens-overshoot",
            "test_backend_stream_stops_at_max_new_tokens",
            "chunk 4 reports 10 tokens, but max_new_tokens is 8 (rule: the stream stops at max_new_tokens)*",
        ),
        (
            "tokens-stay-zero",
            "test_backend_stream_tokens_count_the_text",
            "chunk 0 brings new text * but reports tokens=0, no more than the chunk before (0)*(rule: tokens count*",
        ),
        (
            "tokens-always-one",
            "test_backend_stream_tokens_count_the_text",
            "chunk 1 brings new text * but reports tokens=1, no more than the chunk before (1)*(rule: tokens count*",
        ),
        (
            "cumulative-delta",
            "test_backend_stream_deltas_are_new_text",
            "every delta repeats the one before it and adds to it*(rule: delta is the new text*",
        ),
        (
            "early-finish",
            "test_backend_stream_finish_reason_only_on_the_last_chunk",
            "chunk 2 of * has finish_reason 'stop', then * more chunk(s) came*only the last chunk may have*",
        ),
        (
            "over-budget",
            "test_an_accepted_verdict_fits_the_offer",
            "accepted with estimate.gpu_bytes=1000000000000 but the budget offered is 0*"
            "(rule: an ok verdict fits the offer*",
        ),
        (
            "over-ram",
            "test_an_accepted_verdict_fits_the_offer",
            "accepted with estimate.ram_bytes=1000000000000 but caps.ram_bytes is 0*(rule: an ok verdict fits*",
        ),
        (
            "unrelated-store-entry",
            "test_store_list_lists_the_stored_model_under_anyformer_home",
            "store_list listed 'org/unrelated' at *, which does not exist*",
        ),
        (
            "store-outside-home",
            "test_store_list_lists_the_stored_model_under_anyformer_home",
            "store_list listed 'sample' at *, outside ANYFORMER_HOME=*",
        ),
        (
            "heavy-import",
            "test_plugin_module_imports_no_heavy_engine",
            "importing the plugin module imported wgpu, expected none of*import engines inside load*",
        ),
        (
            "swallows-generator-exit",
            "test_closing_the_stream_early_frees_the_model",
            "close() raised RuntimeError: generator ignored GeneratorExit: the generator caught GeneratorExit*",
        ),
        (
            "shared-cancel",
            "test_cancelling_one_parallel_stream_leaves_the_other_running",
            "the stream left running: got *, expected *",
        ),
        (
            "weak-sample",
            "test_sample_answers_long_enough_to_test_the_stream",
            "the sample is too weak to test the stream: its longest answer is 1 token(s)*"
            "need at least max_new_tokens_for_tests=8 tokens on one prompt*",
        ),
    ],
)
def test_each_mutant_fails_the_kit_test_for_its_rule(
    pytester: pytest.Pytester, mutant: str, kit_test: str, message: str
) -> None:
    result = run_kit(pytester, MUTANT_MODULE.format(name=mutant), "-k", kit_test)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"E  *{message}"])


def test_the_unmutated_wrapper_passes_every_kit_test(pytester: pytest.Pytester) -> None:
    result = run_kit(pytester, MUTANT_MODULE.format(name="correct"), "-rs")
    # Registered in process: the isolated-worker test skips (workers load entry points), and so do the
    # tests of several streams at once (the template serves one).
    skips = 1 + PARALLEL_ITEMS + RUN_ITEMS + CONSTRAINT_ITEMS
    result.assert_outcomes(passed=KIT_ITEMS - skips, skipped=skips)
    result.stdout.fnmatch_lines(
        ["*the backend is registered in-process: an isolated worker loads backends from entry*"]
    )


def test_a_wrapper_serving_two_streams_passes_every_kit_test(pytester: pytest.Pytester) -> None:
    result = run_kit(pytester, MUTANT_MODULE.format(name="serves-two"), "-rs")
    # The one-stream BUSY test gives way to the parallel ones; the isolated-worker test skips as above.
    assert PARALLEL_ITEMS == 4 and RUN_ITEMS == 2
    skips = 2 + RUN_ITEMS + CONSTRAINT_ITEMS
    result.assert_outcomes(passed=KIT_ITEMS - skips, skipped=skips)
    result.stdout.fnmatch_lines(["*the backend serves several streams at once: the parallel tests check it*"])


def test_the_installed_template_passes_every_kit_test(pytester: pytest.Pytester) -> None:
    result = run_kit(pytester, INSTALLED_MODULE)
    skips = PARALLEL_ITEMS + RUN_ITEMS + CONSTRAINT_ITEMS
    result.assert_outcomes(passed=KIT_ITEMS - skips, skipped=skips)
