"""Run a long native build and show how far it is, instead of pip's silent "still running...".

``python3 scripts/build_progress.py --log FILE -- pip wheel -v ...`` runs the command, keeps its
whole output in FILE, and prints one line each time the compile's progress moves on by a percent
(from CMake's ``[ 42%]`` or ninja's ``[120/287]`` lines), with the elapsed time and what is being
compiled; when nothing moves for a while it says it is still working. When the command fails, the
last lines of its output and the log's path are printed, and its exit status is returned: nothing
is hidden. Only the standard library is used (it runs before any virtual environment has packages).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import TextIO

#: CMake's Makefile generator: ``[ 42%] Building CXX object src/CMakeFiles/llama.dir/llama.cpp.o``.
_MAKE_STEP = re.compile(r"^\[\s*(\d{1,3})%\]\s*(.*)$")
#: ninja: ``[120/287] Building CXX object ...`` or, verbose, ``[120/287] /usr/bin/c++ ... -c src/x.cpp``.
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)$")
_OBJECT = re.compile(r"(?:object|Linking \w+ (?:shared |static )?(?:library|executable))\s+(\S+)")
_SOURCE = re.compile(r"\s-c\s+(\S+)")
_OUTPUT = re.compile(r"\s-o\s+(\S+)")
#: pip's own lines worth showing as they are: what it downloads and what it built.
_PIP_LINE = re.compile(r"^\s*(Collecting|Downloading|Building wheel|Created wheel|Saved|Successfully)\b")
TAIL_LINES = 40


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of the compile: how far the build is (0-100) and what it is working on."""

    percent: int
    target: str


def parse_step(line: str) -> Step | None:
    """The build step a CMake or ninja output line reports, or None for any other line."""
    line = line.strip()
    make = _MAKE_STEP.match(line)
    if make:
        return Step(min(int(make.group(1)), 100), _target_of(make.group(2)))
    ninja = _NINJA_STEP.match(line)
    if ninja and int(ninja.group(2)) > 0:
        done, total = int(ninja.group(1)), int(ninja.group(2))
        return Step(min(done * 100 // total, 100), _target_of(ninja.group(3)))
    return None


def _target_of(description: str) -> str:
    """A short name for what a step builds: the source file compiled, or the object or library made."""
    source = _SOURCE.search(description)
    if source:
        return os.path.basename(source.group(1))
    made = _OBJECT.search(description) or _OUTPUT.search(description)
    if made:
        name = os.path.basename(made.group(1))
        return name[:-2] if name.endswith(".o") else name
    return description[:60]


def format_elapsed(seconds: float) -> str:
    """``m:ss`` (or ``h:mm:ss``) for a person."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressReporter:
    """Turns the build's output lines into a few lines for a person; keeps the tail for a failure."""

    def __init__(self, out: TextIO, started: float, *, heartbeat: float) -> None:
        self.out = out
        self.started = started
        self.heartbeat = heartbeat
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.percent = -1
        self.target = ""
        self.last_print = started

    def _say(self, now: float, text: str) -> None:
        self.out.write(f"  [{format_elapsed(now - self.started)}] {text}\n")
        self.out.flush()
        self.last_print = now

    def line(self, text: str, now: float) -> None:
        """One line of the build's output."""
        self.tail.append(text.rstrip("\n"))
        step = parse_step(text)
        if step is not None:
            self.target = step.target
            if step.percent != self.percent:
                self.percent = step.percent
                self._say(now, f"{step.percent:3d}% compiling {step.target}")
        elif _PIP_LINE.match(text):
            self._say(now, text.strip()[:160])

    def tick(self, now: float) -> None:
        """Called when no line came for a while: say the build is still going."""
        if now - self.last_print >= self.heartbeat:
            where = f" ({self.percent}%, at {self.target})" if self.percent >= 0 else ""
            self._say(now, f"still building{where}")

    def failed(self, status: int, log: str | None) -> None:
        """The build failed: its last lines, and where the whole output is."""
        self.out.write(f"the build failed (exit status {status}); its last {len(self.tail)} lines:\n")
        for text in self.tail:
            self.out.write(f"  | {text}\n")
        if log:
            self.out.write(f"the whole output: {log}\n")
        self.out.flush()


def run(command: Sequence[str], *, log: str | None, heartbeat: float = 30.0, out: TextIO = sys.stderr) -> int:
    """Run ``command``, report its progress on ``out``; its exit status (1 if it cannot start)."""
    started = time.monotonic()
    reporter = ProgressReporter(out, started, heartbeat=heartbeat)
    try:
        child = subprocess.Popen(
            list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1
        )
    except OSError as exc:
        out.write(f"cannot run {command[0]}: {exc}\n")
        return 1
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert child.stdout is not None
        for text in child.stdout:
            lines.put(text)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    log_file = open(log, "w", encoding="utf-8") if log else None  # closed in the finally below
    try:
        while True:
            try:
                text = lines.get(timeout=min(heartbeat, 5.0))
            except queue.Empty:
                reporter.tick(time.monotonic())
                continue
            if text is None:
                break
            if log_file is not None:
                log_file.write(text)
            reporter.line(text, time.monotonic())
            reporter.tick(time.monotonic())
        status = child.wait()
    except KeyboardInterrupt:
        child.terminate()
        child.wait()
        return 130
    finally:
        if log_file is not None:
            log_file.close()
    if status != 0:
        reporter.failed(status, log)
    else:
        out.write(f"  [{format_elapsed(time.monotonic() - started)}] done\n")
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """``build_progress.py [--log FILE] [--heartbeat S] -- COMMAND...``; exits with the command's status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", help="keep the command's whole output here")
    parser.add_argument("--heartbeat", type=float, default=30.0, help="seconds of silence before 'still building'")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the build command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the build command after --")
    return run(command, log=args.log, heartbeat=args.heartbeat)


if __name__ == "__main__":
    sys.exit(main())
