"""Assertion helpers for the conformance kit: each failure reads as observed vs expected.

Every helper takes ``where``, the call that produced what it checks (``generate(max_new_tokens=8)``),
and ends its message with it in brackets, as array-api-tests does::

    tokens went 5 -> 4, but must never decrease [generate(max_new_tokens=8)]

The helpers set ``__tracebackhide__`` so a failure points at the kit's test, not at this module.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any, NoReturn

from anyformer import AnyformerError, Chunk, ErrorCode, Estimate, ProgressEvent, Rank, Refusal, StoreEntry, Verdict

__all__ = [
    "FINISH_REASONS",
    "MAX_CHARS_PER_TOKEN",
    "check_backend_chunk_types",
    "check_backend_chunks",
    "check_can_run_watch",
    "check_deltas_are_new_text",
    "check_error_code",
    "check_need",
    "check_prefix",
    "check_refusal_code",
    "check_run_progress",
    "check_same_text",
    "check_stop_cut",
    "check_store_entry",
    "check_store_entry_size",
    "check_stream",
    "check_tokens_count_the_text",
    "check_verdict",
    "check_verdict_fits",
    "check_verdict_not_crashed",
    "fail",
    "size_on_disk",
]

#: The finish reasons a stream may end with (docs/contract.md, "Streaming").
FINISH_REASONS = frozenset({"stop", "length", "cancelled"})
#: The refusals that carry ``need`` (docs/contract.md, "Verdicts").
NEED_CODES = frozenset({Refusal.BUDGET, Refusal.MEMORY})
#: The most characters of text one token may stand for, on average over a stream. Generous on
#: purpose (real vocabularies average 3 to 5 characters a token, their longest tokens are runs of
#: 16 to 32 spaces): it only catches a count unrelated to the text, never an unusual tokenizer.
MAX_CHARS_PER_TOKEN = 64
# How the core words a verdict it made from a can_run that raised or returned the wrong thing.
_CRASH_PREFIXES = ("can_run raised", "plugin error:")


def fail(message: str, where: str) -> NoReturn:
    """Fail the test with ``message [where]``."""
    __tracebackhide__ = True
    raise AssertionError(f"{message} [{where}]")


# ---- verdicts -------------------------------------------------------------------------------------


def check_verdict_not_crashed(verdict: Verdict, where: str) -> None:
    """The backend's ``can_run`` answered; it did not raise (the core turns a raise into ``runtime``)."""
    __tracebackhide__ = True
    if verdict.code is Refusal.RUNTIME and verdict.reason.startswith(_CRASH_PREFIXES):
        fail(f"can_run did not answer: {verdict.reason!r}; it must return a Verdict, not raise", where)


def check_verdict(verdict: Any, backend_id: str, where: str) -> None:
    """A well-formed verdict of ``backend_id``: ok with an estimate, or a closed refusal code with one line."""
    __tracebackhide__ = True
    if not isinstance(verdict, Verdict):
        fail(f"got {type(verdict).__name__}, expected an anyformer.Verdict", where)
    check_verdict_not_crashed(verdict, where)
    if verdict.backend != backend_id:
        fail(f"verdict.backend is {verdict.backend!r}, expected the entry point name {backend_id!r}", where)
    if verdict.ok is not True and verdict.ok is not False:
        fail(f"verdict.ok is {verdict.ok!r}, expected True or False", where)
    if verdict.ok:
        if verdict.code is not None or verdict.need is not None:
            fail(f"an ok verdict has code={verdict.code!r} need={verdict.need!r}, expected both None", where)
        _check_estimate(verdict.estimate, where)
        return
    if not isinstance(verdict.code, Refusal):
        fail(f"refusal code is {verdict.code!r}, expected one of {sorted(r.value for r in Refusal)}", where)
    if not verdict.reason.strip() or verdict.reason.strip() == verdict.code.value:
        fail(
            f"refusal {verdict.code.value!r} has reason {verdict.reason!r}, expected one line a person understands",
            where,
        )
    if "\n" in verdict.reason:
        fail(f"reason has {verdict.reason.count(chr(10)) + 1} lines, expected one: {verdict.reason!r}", where)


def _check_estimate(estimate: Any, where: str) -> None:
    __tracebackhide__ = True
    if not isinstance(estimate, Estimate):
        fail(f"an ok verdict's estimate is {type(estimate).__name__}, expected an anyformer.Estimate", where)
    for field in ("gpu_bytes", "ram_bytes", "disk_bytes"):
        value = getattr(estimate, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            fail(f"estimate.{field} is {value!r}, expected an integer number of bytes >= 0", where)
    speed = estimate.tok_per_sec
    if speed is not None and (isinstance(speed, bool) or not isinstance(speed, (int, float)) or speed < 0):
        fail(f"estimate.tok_per_sec is {speed!r}, expected None or a number >= 0", where)
    if not isinstance(estimate.rank, Rank):
        fail(f"estimate.rank is {estimate.rank!r}, expected an anyformer.Rank", where)


def check_verdict_fits(verdict: Verdict, *, budget: int, ram: int, where: str) -> None:
    """An ok verdict's estimate fits what was offered: ``gpu_bytes <= budget``, ``ram_bytes <= ram``."""
    __tracebackhide__ = True
    if not verdict.ok:
        return
    estimate = verdict.estimate
    if estimate is None:
        fail("an ok verdict has no estimate, expected an anyformer.Estimate", where)
    if estimate.gpu_bytes > budget:
        fail(
            f"accepted with estimate.gpu_bytes={estimate.gpu_bytes} but the budget offered is {budget}: "
            "an accepted verdict must fit the budget (rule: an ok verdict fits the offer; "
            "otherwise refuse with 'budget' and need=)",
            where,
        )
    if estimate.ram_bytes > ram:
        fail(
            f"accepted with estimate.ram_bytes={estimate.ram_bytes} but caps.ram_bytes is {ram}: "
            "an accepted verdict must fit the host memory (rule: an ok verdict fits the offer; "
            "otherwise refuse with 'memory' and need=)",
            where,
        )


def check_can_run_watch(
    *, elapsed: float, limit_s: float, opened: Sequence[str], connections: Sequence[str], where: str
) -> None:
    """One ``can_run`` answered in time, opened none of the model's files and tried no connection."""
    __tracebackhide__ = True
    if opened:
        fail(
            f"can_run opened {sorted(set(opened))}, expected no model file to be opened "
            "(rule: can_run reads the description only, never the weights)",
            where,
        )
    if connections:
        fail(
            f"can_run tried to connect to {list(connections)}, expected no network "
            "(rule: can_run reads the description only, never the network)",
            where,
        )
    if elapsed > limit_s:
        fail(
            f"can_run took {elapsed:.1f} s, expected under {limit_s:g} s "
            "(rule: can_run is cheap, it runs on every anyformer check)",
            where,
        )


def _code(verdict: Verdict) -> str:
    return "ok" if verdict.ok or verdict.code is None else Refusal(verdict.code).value


def check_refusal_code(verdict: Verdict, expected: Refusal | str | None, where: str) -> None:
    """The verdict is a refusal with ``expected`` code (or ok, when ``expected`` is None)."""
    __tracebackhide__ = True
    if expected is None:
        if not verdict.ok:
            fail(f"refused with {_code(verdict)!r} ({verdict.reason}), expected ok", where)
        return
    want = Refusal(expected)
    if verdict.ok:
        fail(f"accepted, expected a {want.value!r} refusal", where)
    if verdict.code is not want:
        fail(f"refused with {_code(verdict)!r} ({verdict.reason}), expected {want.value!r}", where)


def check_need(verdict: Verdict, *, budget: int, ram: int, where: str) -> None:
    """``need`` exactly on budget and memory refusals, and more than what was offered."""
    __tracebackhide__ = True
    if verdict.ok or verdict.code not in NEED_CODES:
        if verdict.need is not None:
            fail(
                f"a {_code(verdict)!r} verdict carries need={verdict.need!r}, "
                "expected None (only budget and memory refusals carry need)",
                where,
            )
        return
    offered, what = (budget, "budget") if verdict.code is Refusal.BUDGET else (ram, "ram_bytes")
    need = verdict.need
    if isinstance(need, bool) or not isinstance(need, int):
        fail(f"a {_code(verdict)!r} refusal carries need={need!r}, expected the bytes that would fit", where)
    if need <= offered:
        fail(
            f"a {_code(verdict)!r} refusal carries need={need} with {what}={offered} offered, "
            f"but need must be larger than what was offered",
            where,
        )


# ---- streams --------------------------------------------------------------------------------------


def check_backend_chunk_types(chunks: Sequence[Any], where: str) -> None:
    """Every item a ``generate`` hook yielded is a Chunk with a string delta and an int token count."""
    __tracebackhide__ = True
    for index, chunk in enumerate(chunks):
        if not isinstance(chunk, Chunk):
            fail(f"chunk {index} is {type(chunk).__name__}, expected an anyformer.Chunk", where)
        if not isinstance(chunk.delta, str):
            fail(f"chunk {index} has delta {chunk.delta!r}, expected a string", where)
        if isinstance(chunk.tokens, bool) or not isinstance(chunk.tokens, int):
            fail(f"chunk {index} has tokens={chunk.tokens!r}, expected an integer", where)


def check_backend_chunks(chunks: Sequence[Any], where: str) -> None:
    """What a backend's own ``generate`` hook yields: Chunks whose ``tokens`` never decrease."""
    __tracebackhide__ = True
    check_backend_chunk_types(chunks, where)
    previous = 0
    for chunk in chunks:
        if chunk.tokens < previous:
            fail(
                f"tokens went {previous} -> {chunk.tokens}, but must never decrease "
                "(rule: tokens count every token of the call, also on the last chunk)",
                where,
            )
        previous = chunk.tokens


def check_tokens_count_the_text(chunks: Sequence[Chunk], where: str) -> None:
    """``tokens`` counts the tokens behind the text (the rule is in the message).

    A chunk that brings new text reports more tokens than the chunk before it (only the last
    chunk may flush held-back text without a new token); a stream with text ends with at least
    one token; and the text is at most :data:`MAX_CHARS_PER_TOKEN` characters per token.
    """
    __tracebackhide__ = True
    previous = 0
    for index, chunk in enumerate(chunks):
        if chunk.delta and chunk.tokens <= previous and index < len(chunks) - 1:
            fail(
                f"chunk {index} brings new text {chunk.delta!r} but reports tokens={chunk.tokens}, no more than "
                f"the chunk before ({previous}): a chunk with new text counts the token(s) that made it "
                "(rule: tokens count the text; only the last chunk may flush held-back text without a new token)",
                where,
            )
        previous = max(previous, chunk.tokens)
    text = "".join(c.delta for c in chunks)
    final = chunks[-1].tokens if chunks else 0
    if text and final < 1:
        fail(
            f"the stream produced {len(text)} characters ({text[:40]!r}) but ends with tokens={final}: "
            "tokens counts the tokens generated so far (rule: tokens count the text)",
            where,
        )
    if len(text) > MAX_CHARS_PER_TOKEN * max(final, 1):
        fail(
            f"the stream produced {len(text)} characters with tokens={final}, over {MAX_CHARS_PER_TOKEN} "
            "characters per token: tokens counts the tokens generated, not chunks or calls "
            "(rule: tokens count the text)",
            where,
        )


def check_deltas_are_new_text(chunks: Sequence[Chunk], where: str) -> None:
    """``delta`` is the new text only: deltas that each repeat the one before and add to it are cumulative.

    Three or more non-empty deltas, every one starting with the delta before it and longer, is
    what yielding the text so far as ``delta`` looks like; a real model's tokens do not do that.
    """
    __tracebackhide__ = True
    deltas = [c.delta for c in chunks if c.delta]
    if len(deltas) >= 3 and all(b.startswith(a) and len(b) > len(a) for a, b in pairwise(deltas)):
        shown = ", ".join(repr(d) for d in deltas[:4]) + (", ..." if len(deltas) > 4 else "")
        fail(
            f"every delta repeats the one before it and adds to it ({shown}): delta must carry only the new "
            "text, not the text so far (rule: delta is the new text; the core builds text)",
            where,
        )
    before = "".join(deltas[:-1])
    if len(deltas) >= 3 and len(before) >= 3 and deltas[-1].startswith(before):
        fail(
            f"the last delta {deltas[-1][:60]!r} repeats the whole text before it ({before[:60]!r}): delta must "
            "carry only the new text, also on the last chunk (rule: delta is the new text; the core builds text)",
            where,
        )


def check_prefix(shorter: str, longer: str, what: str, where: str) -> None:
    """``shorter`` is where ``longer`` starts: more tokens only add text after it."""
    __tracebackhide__ = True
    if not longer.startswith(shorter):
        fail(
            f"{what}: {shorter!r} is not the start of {longer!r}: with twice the tokens greedy text must go on "
            "from where it stopped (rule: greedy text at N tokens is a prefix of the text at 2N)",
            where,
        )


def check_stop_cut(text: str, finish_reason: str | None, *, before: str, stop: str, where: str) -> None:
    """A stream asked to stop at ``stop`` ends with ``before`` (the greedy text up to the stop) and ``stop``."""
    __tracebackhide__ = True
    if text != before or finish_reason != "stop":
        fail(
            f"with stop={stop!r} the text is {text!r} ending with {finish_reason!r}, expected {before!r} "
            "(the greedy text up to the stop string) ending with 'stop' "
            "(rule: a stop string ends the text just before it)",
            where,
        )


def check_stream(chunks: Sequence[Chunk], max_new_tokens: int, where: str) -> None:
    """A whole stream as a caller sees it (docs/contract.md, "Streaming")."""
    __tracebackhide__ = True
    if not chunks:
        fail("the stream yielded no chunk, expected at least the last one with a finish_reason", where)
    text = ""
    previous = 0
    for index, chunk in enumerate(chunks):
        if chunk.text != text + chunk.delta:
            fail(
                f"chunk {index} has text {chunk.text!r}, but the previous text {text!r} plus delta {chunk.delta!r} "
                f"is {text + chunk.delta!r}: text must be cumulative",
                where,
            )
        text = chunk.text
        if chunk.tokens < previous:
            fail(f"tokens went {previous} -> {chunk.tokens}, but must never decrease", where)
        previous = chunk.tokens
    _check_token_limit(chunks, max_new_tokens, where)
    _check_finish_reasons(chunks, where, require_last=True)
    last = chunks[-1]
    if last.finish_reason == "length" and last.tokens != max_new_tokens:
        fail(f"finish_reason is 'length' after {last.tokens} tokens, but max_new_tokens is {max_new_tokens}", where)


def _check_token_limit(chunks: Sequence[Chunk], max_new_tokens: int, where: str) -> None:
    __tracebackhide__ = True
    for index, chunk in enumerate(chunks):
        if chunk.tokens > max_new_tokens:
            fail(f"chunk {index} reports {chunk.tokens} tokens, but max_new_tokens is {max_new_tokens}", where)


def _check_finish_reasons(chunks: Sequence[Chunk], where: str, *, require_last: bool) -> None:
    __tracebackhide__ = True
    for index, chunk in enumerate(chunks[:-1]):
        if chunk.finish_reason is not None:
            fail(
                f"chunk {index} of {len(chunks)} has finish_reason {chunk.finish_reason!r}, "
                f"but only the last chunk may have one",
                where,
            )
    if not chunks:
        return
    last = chunks[-1].finish_reason
    if last is None and not require_last:
        return
    if last not in FINISH_REASONS:
        fail(f"the last chunk has finish_reason {last!r}, expected one of {sorted(FINISH_REASONS)}", where)


def check_same_text(observed: str, expected: str, what: str, where: str) -> None:
    """Two texts that must be equal; the message shows both."""
    __tracebackhide__ = True
    if observed != expected:
        fail(f"{what}: got {observed!r}, expected {expected!r}", where)


def check_error_code(error: BaseException | None, expected: ErrorCode | str, where: str) -> None:
    """``error`` is an ``AnyformerError`` with the ``expected`` code."""
    __tracebackhide__ = True
    want = ErrorCode(expected)
    if error is None:
        fail(f"no error was raised, expected AnyformerError({want.value})", where)
    if not isinstance(error, AnyformerError):
        fail(f"raised {type(error).__name__}: {error}, expected AnyformerError({want.value})", where)
    if error.code is not want:
        fail(f"raised AnyformerError({error.code.value}): {error.message}, expected {want.value}", where)


# ---- the store ------------------------------------------------------------------------------------


def check_run_progress(events: Sequence[Any], backend_id: str, where: str) -> None:
    """A ``run``'s progress events: at least one, each a ``ProgressEvent`` of this backend with a stage,
    ``0 <= done <= total`` (when ``total`` is known), ``done`` never decreasing within a stage and
    ``total`` fixed within it (docs/contract.md, "Progress and cancel of a run")."""
    __tracebackhide__ = True
    if not events:
        fail("the run declared run_progress but reported no event, expected one after each unit of work", where)
    last: dict[str, tuple[int, int | None]] = {}
    for index, event in enumerate(events):
        if not isinstance(event, ProgressEvent):
            fail(f"event {index} is {type(event).__name__}, expected anyformer.ProgressEvent", where)
        if event.backend not in (None, backend_id):
            fail(f"event {index} names backend {event.backend!r}, expected {backend_id!r} (or None)", where)
        if not isinstance(event.stage, str) or not event.stage:
            fail(f"event {index} has stage {event.stage!r}, expected a word such as 'embed'", where)
        done, total = event.done, event.total
        if isinstance(done, bool) or not isinstance(done, int) or done < 0:
            fail(f"event {index} has done={done!r}, expected an int >= 0", where)
        if total is not None and (isinstance(total, bool) or not isinstance(total, int) or done > total):
            fail(f"event {index} has done={done} of total={total!r}, expected done <= total", where)
        if event.stage in last:
            before, before_total = last[event.stage]
            if done < before:
                fail(f"{event.stage!r} went {before} -> {done}, but done must never decrease", where)
            if total != before_total:
                fail(f"{event.stage!r} changed its total {before_total} -> {total} within one run", where)
        last[event.stage] = (done, total)


def check_store_entry(entry: Any, backend_id: str, where: str) -> None:
    """One ``store_list`` entry: a StoreEntry of this backend with repo, path and a byte count."""
    __tracebackhide__ = True
    if not isinstance(entry, StoreEntry):
        fail(f"got {type(entry).__name__}, expected an anyformer.StoreEntry", where)
    if entry.backend != backend_id:
        fail(f"entry.backend is {entry.backend!r}, expected {backend_id!r}", where)
    if not isinstance(entry.repo, str) or not entry.repo:
        fail(f"entry.repo is {entry.repo!r}, expected a non-empty string", where)
    if not isinstance(entry.path, str) or not entry.path:
        fail(f"entry.path is {entry.path!r}, expected a non-empty string", where)
    if entry.revision is not None and not isinstance(entry.revision, str):
        fail(f"entry.revision is {entry.revision!r}, expected None or a string", where)
    if isinstance(entry.bytes, bool) or not isinstance(entry.bytes, int) or entry.bytes < 0:
        fail(f"entry.bytes is {entry.bytes!r}, expected an integer >= 0", where)


def size_on_disk(path: str | os.PathLike[str]) -> int:
    """The bytes ``path`` holds: a file's size, or the sizes of the files under a folder added up."""
    root = Path(path)
    if not root.is_dir():
        return root.stat().st_size
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def check_store_entry_size(entry: StoreEntry, where: str) -> None:
    """An entry's ``bytes`` is the size of what its ``path`` names (``anyformer ls`` adds them up)."""
    __tracebackhide__ = True
    size = size_on_disk(entry.path)
    if entry.bytes != size:
        fail(
            f"entry {entry.repo!r} says bytes={entry.bytes}, but {entry.path!r} holds {size} bytes "
            "(rule: StoreEntry.bytes is the size of path, a file or a folder's files together)",
            where,
        )
