"""Whisper's long-form and timestamp rules, as transformers' pipeline and ``generate`` apply them; pure functions.

- :func:`chunk_spans`: the pipeline's chunking (``chunk_length_s`` with ``stride_length_s`` of overlap
  on each inner side): windows start every ``chunk - left - right`` samples; the first has no left
  stride, the last (the one that reaches the end) no right stride; a window no longer than its left
  stride is dropped.
- :func:`timestamp_rules`: Whisper's timestamp logits rules (``<|notimestamps|>`` never; the first
  token a timestamp, at most ``max_initial_timestamp_index``; timestamps in pairs except before the
  end; never decreasing; a timestamp whenever the timestamps together outweigh the best text token).
- :func:`split_segments`: where decoding of a window resumes (Whisper's ``seek``): after the first
  timestamp of the last pair of consecutive timestamps (the tokens after that pair are dropped), or
  at the window's end when the reply ends on a single timestamp or has no pair.
- :func:`merge_windows`: the pipeline's Whisper decoding of the windows' tokens: text tokens split
  into segments at timestamps (offset by each window's start less its left stride; a timestamp
  smaller than the previous starts a new sequential segment), timestamps inside a stride skipped,
  and the overlapping windows' token runs joined where they agree best
  (:func:`longest_common_merge`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

#: Timestamp positions a window holds (Whisper's 1500 encoder positions); used when a timestamp
#: goes back, for a window that had ended on a single timestamp.
SEGMENT_POSITIONS = 1500


def chunk_spans(total: int, chunk: int, left: int, right: int) -> list[tuple[int, int, int, int]]:
    """``(start, end, left stride, right stride)`` in samples for ``total`` samples (module docstring)."""
    step = chunk - left - right
    spans = []
    for start in range(0, total, step):
        end = min(start + chunk, total)
        is_last = start + chunk >= total
        stride_left = 0 if start == 0 else left
        if end - start > stride_left:
            spans.append((start, end, stride_left, 0 if is_last else right))
        if is_last:
            break
    return spans


def timestamp_rules(
    scores: np.ndarray,
    reply: Sequence[int],
    *,
    timestamp_begin: int,
    no_timestamps: int,
    eos: int,
    max_initial: int | None,
) -> None:
    """Mask ``scores`` (float32, one step's logits after the suppressions) in place by Whisper's timestamp rules."""
    scores[no_timestamps] = -np.inf
    last_was = len(reply) >= 1 and reply[-1] >= timestamp_begin
    penultimate_was = len(reply) < 2 or reply[-2] >= timestamp_begin
    if last_was:
        if penultimate_was:  # a pair just closed: text (or the end) next
            scores[timestamp_begin:] = -np.inf
        else:  # one timestamp opened a pair: no text token now
            scores[:eos] = -np.inf
    stamps = [token for token in reply if token >= timestamp_begin]
    if stamps:
        floor = stamps[-1] if last_was and not penultimate_was else stamps[-1] + 1
        scores[timestamp_begin:floor] = -np.inf
    if not reply:
        scores[:timestamp_begin] = -np.inf
        if max_initial is not None:
            scores[timestamp_begin + max_initial + 1 :] = -np.inf
    finite = scores[np.isfinite(scores)]
    if finite.size == 0:
        return
    top = float(finite.max())
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        shifted = np.exp(scores.astype(np.float64) - top)
        total = np.log(shifted.sum())
        timestamp_mass = np.log(shifted[timestamp_begin:].sum()) - total
        best_text = float(scores[:timestamp_begin].max()) - top - total
    if timestamp_mass > best_text:
        scores[:timestamp_begin] = -np.inf


def split_segments(reply: Sequence[int], timestamp_begin: int, stride: int) -> tuple[list[int], int | None]:
    """The tokens of ``reply`` that are kept and the frames to advance (None: to the window's end)."""
    flags = [token >= timestamp_begin for token in reply]
    pairs = [i + 1 for i in range(len(flags) - 1) if flags[i] and flags[i + 1]]
    if not pairs or flags[-2:] == [False, True]:
        return list(reply), None
    cut = pairs[-1] + 1  # the last segment keeps its closing timestamp
    return list(reply[:cut]), (reply[cut - 2] - timestamp_begin) * stride


def longest_common_merge(sequences: Sequence[Sequence[int]]) -> list[int]:
    """Join token runs of overlapping windows at their best alignment, each side keeping its half of the overlap.

    Every shift of the right run against the end of the left one is scored by its equal tokens over
    the overlap's length plus a tiny bonus for longer overlaps; at least two tokens must agree. The
    left run's tokens before the overlap's middle are kept, then the right run's from its middle.
    """
    left = list(sequences[0])
    merged: list[int] = []
    for following in sequences[1:]:
        right = list(following)
        size_left, size_right = len(left), len(right)
        best = 0.0
        chosen = (size_left, size_left, 0, 0)
        for shift in range(1, size_left + size_right):
            left_start, left_stop = max(0, size_left - shift), min(size_left, size_left + size_right - shift)
            right_start, right_stop = max(0, shift - size_left), min(size_right, shift)
            matches = sum(
                a == b for a, b in zip(left[left_start:left_stop], right[right_start:right_stop], strict=True)
            )
            score = matches / shift + shift / 10000.0
            if matches > 1 and score > best:
                best = score
                chosen = (left_start, left_stop, right_start, right_stop)
        left_start, left_stop, right_start, right_stop = chosen
        merged.extend(left[: (left_start + left_stop) // 2])
        left = right[(right_start + right_stop) // 2 :]
    merged.extend(left)
    return merged


def merge_windows(
    windows: Iterable[tuple[Sequence[int], tuple[float, float, float]]],
    *,
    timestamp_begin: int,
    precision: float,
    special: set[int],
    languages: Mapping[int, str],
    timestamps: bool,
    decode: Callable[[list[int]], str],
) -> tuple[str, list[dict[str, Any]], list[int]]:
    """The text, the segments ``{"text", "timestamp": (start, end)}`` and the text's token ids of the windows.

    ``windows`` are each window's generated tokens with ``(length, left stride, right stride)`` in
    seconds. ``special`` ids below ``timestamp_begin`` are not text; a change of ``languages`` token
    ends a segment when timestamps are not wanted.
    """
    segments: list[dict[str, Any]] = []
    resolved_ids: list[int] = []
    state: dict[str, Any] = {"language": None}

    def fresh() -> dict[str, Any]:
        return {"timestamp": [None, None], "text": ""}

    def close(segment: dict[str, Any], runs: list[list[int]]) -> None:
        ids = longest_common_merge(runs)
        segment["text"] = decode(ids)
        resolved_ids.extend(ids)
        segments.append(segment)

    segment = fresh()
    offset = 0.0
    runs: list[list[int]] = []
    skip = False
    for tokens, (length, stride_left, stride_right) in windows:
        last_timestamp: int | None = None
        first_timestamp: float = timestamp_begin
        highest = previous_highest = carried = 0.0
        offset -= stride_left
        right_start = length - stride_right
        if stride_left:
            first_timestamp = stride_left / precision + timestamp_begin
        if stride_right:  # the timestamps inside the right stride are resolved by the next window
            for token in reversed(tokens):
                if token >= timestamp_begin:
                    if last_timestamp is not None and (token - timestamp_begin) * precision < right_start:
                        break
                    last_timestamp = token
        current: list[int] = []
        for i, token in enumerate(tokens):
            if token >= timestamp_begin:
                stamp = float((token - timestamp_begin) * precision)
                if stamp < highest:  # a later sequential segment of the same window
                    single_ending = i >= 2 and not (
                        tokens[i - 1] >= timestamp_begin and tokens[i - 2] >= timestamp_begin
                    )
                    if single_ending:
                        carried += precision * SEGMENT_POSITIONS
                    else:
                        highest = previous_highest
                        carried += previous_highest
                previous_highest, highest = highest, stamp
                time = round((token - timestamp_begin) * precision + offset + carried, 2)
                if last_timestamp and token >= last_timestamp:
                    skip = True  # inside the right stride; the pair's other half is skipped too
                elif skip or (runs and token < first_timestamp):
                    skip = False
                elif segment["timestamp"][0] is None:
                    segment["timestamp"][0] = time
                elif time != segment["timestamp"][0]:
                    segment["timestamp"][1] = time
                    runs.append(current)
                    close(segment, runs)
                    runs, current, segment = [], [], fresh()
            elif token in special:
                language = languages.get(token)
                if language is not None:
                    if state["language"] and language != state["language"] and not timestamps:
                        runs.append(current)
                        close(segment, runs)
                        runs, current, segment = [], [], fresh()
                    state["language"] = language
            else:
                current.append(token)
        offset += length - stride_right
        if current:
            runs.append(current)
        elif not any(runs):
            segment, runs = fresh(), []
    if runs:
        close(segment, runs)
    text = "".join(s["text"] for s in segments)
    return text, [{"text": s["text"], "timestamp": tuple(s["timestamp"])} for s in segments], resolved_ids
