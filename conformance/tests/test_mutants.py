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
#: The items that import the plugin from its entry point in another process: an in-process object skips them.
IN_PROCESS_ITEMS = 2

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
            "ignores-seed",
            "test_seeded_sampling_is_repeatable",
            "the same seed gave *, then *: expected the same text "
            "(rule: at temperature > 0 the seed makes sampling repeatable)*",
        ),
        (
            "always-greedy",
            "test_sampling_is_not_always_greedy",
            "all 8 seeds gave the greedy text *(rule: temperature > 0 samples*",
        ),
        (
            "samples-at-temperature-zero",
            "test_temperature_zero_is_repeatable_whatever_the_seed",
            "got *, but with no seed *: expected the greedy text whatever the seed "
            "(rule: temperature 0 is greedy and repeatable)*",
        ),
        (
            "stops-at-the-first-character",
            "test_a_stop_string_from_the_greedy_text_ends_the_text_before_it",
            "with stop=* the text is * ending with 'stop', expected * (the greedy text up to the stop string) "
            "ending with 'stop' (rule: a stop string ends the text just before it)*",
        ),
        (
            "last-delta-repeats-the-text",
            "test_backend_stream_deltas_are_new_text",
            "the last delta * repeats the whole text before it*(rule: delta is the new text*",
        ),
        (
            "marks-the-limit",
            "test_greedy_text_at_n_tokens_is_the_start_of_the_text_at_2n",
            "the text at 8 tokens: * is not the start of *"
            "(rule: greedy text at N tokens is a prefix of the text at 2N)*",
        ),
        (
            "tokens-reset-on-cancel",
            "test_backend_stream_stops_when_cancelled",
            "tokens went 1 -> 0, but must never decrease (rule: tokens count every token of the call*",
        ),
        (
            "changes-the-messages",
            "test_backend_generate_leaves_the_messages_unchanged",
            "messages went * -> *: expected them unchanged (rule: generate does not change the caller's messages)*",
        ),
        (
            "need-offer-plus-one",
            "test_offering_exactly_the_need_is_accepted",
            "a 'memory' refusal named need=*, and offering exactly that was refused with 'memory' again*"
            "(rule: offering exactly the need is accepted)*",
        ),
        (
            "estimates-no-ram",
            "test_offering_exactly_the_estimate_is_accepted_and_less_is_refused",
            "the estimate on the full machine has ram_bytes=0, and offering exactly that was refused with 'memory'*"
            "(rule: offering exactly an ok estimate is accepted)*",
        ),
        (
            "estimate-follows-the-offer",
            "test_offering_exactly_the_estimate_is_accepted_and_less_is_refused",
            "the estimate on the full machine has ram_bytes=8589934592, and 8589934591 was accepted too*"
            "(rule: a little less than an ok estimate is refused*",
        ),
        (
            "reads-the-weights",
            "test_sample_verdict_is_ok_and_well_formed",
            "can_run opened [[]*ngram.json*[]], expected no model file to be opened "
            "(rule: can_run reads the description only, never the weights)*",
        ),
        (
            "slow-first-can-run",
            "test_the_first_can_run_of_a_fresh_interpreter_is_quick_and_reads_nothing",
            "can_run took 1.5 s, expected under 1 s (rule: can_run is cheap, it runs on every anyformer check)*",
        ),
        (
            "accepts-a-tokenizer",
            "test_can_run_refuses_a_foreign_format",
            "got ok, expected a 'format' or 'model' refusal (rule: a repo without a file of your format*",
        ),
        (
            "task-before-format",
            "test_a_foreign_format_is_refused_with_format_before_the_task",
            "got 'task' (*), expected 'format' (rule: refusals are checked in order, format before task)*",
        ),
        (
            "accepts-any-task",
            "test_an_unknown_task_is_refused_with_task",
            "got ok, expected 'task' (rule: a task the backend does not run is refused)*",
        ),
        (
            "leaves-a-thread",
            "test_load_and_dispose_leave_no_thread_or_file_open",
            "1 thread(s) still running after dispose: [[]'template-watchdog'[]], expected none "
            "(rule: dispose stops what load started)*",
        ),
        (
            "leaves-a-file-open",
            "test_load_and_dispose_leave_no_thread_or_file_open",
            "1 file descriptor(s) still open after dispose: [[]*log.txt*[]], expected none "
            "(rule: dispose closes what load opened)*",
        ),
        (
            "store-bytes-wrong",
            "test_store_list_entries_are_well_formed",
            "entry 'sample' says bytes=1, but * holds * bytes (rule: StoreEntry.bytes is the size of path*",
        ),
        (
            "prints-at-import",
            "test_plugin_module_prints_nothing_at_import",
            "the import wrote 'template backend ready\\n' to stdout, expected nothing "
            "(rule: a plugin prints nothing at import*",
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
    # An in-process object: the isolated-worker and fresh-interpreter tests skip (they import entry points),
    # and so do the tests of several streams at once (the template serves one) and of structured output.
    skipped = IN_PROCESS_ITEMS + PARALLEL_ITEMS + RUN_ITEMS + CONSTRAINT_ITEMS
    result.assert_outcomes(passed=KIT_ITEMS - skipped, skipped=skipped)
    result.stdout.fnmatch_lines(
        [
            "*the backend is an in-process object: a fresh interpreter cannot import it*",
            "*the backend is registered in-process: an isolated worker loads backends from entry*",
        ]
    )


def test_a_wrapper_serving_two_streams_passes_every_kit_test(pytester: pytest.Pytester) -> None:
    result = run_kit(pytester, MUTANT_MODULE.format(name="serves-two"), "-rs")
    # The one-stream BUSY test gives way to the parallel ones; the in-process tests skip as above.
    assert PARALLEL_ITEMS == 4 and RUN_ITEMS == 2
    skipped = 1 + IN_PROCESS_ITEMS + RUN_ITEMS + CONSTRAINT_ITEMS
    result.assert_outcomes(passed=KIT_ITEMS - skipped, skipped=skipped)
    result.stdout.fnmatch_lines(["*the backend serves several streams at once: the parallel tests check it*"])


def test_the_installed_template_passes_every_kit_test(pytester: pytest.Pytester) -> None:
    result = run_kit(pytester, INSTALLED_MODULE)
    skips = PARALLEL_ITEMS + RUN_ITEMS + CONSTRAINT_ITEMS
    result.assert_outcomes(passed=KIT_ITEMS - skips, skipped=skips)
