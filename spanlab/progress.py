"""Progress of the phases a user waits on: held-out evaluations, warm start, SFT rounds, GRPO steps and rollouts.

Every phase is ``with progress.phase(label, total) as bar: ... bar.advance(note=...)``, whoever runs it, so
each phase shows the same things: done / total, a note (running accuracy, loss, reward), the time elapsed and
an ETA from the phase's own average rate (a GRPO step takes minutes, longer than any sliding speed window).

On a terminal the open phases are rich bars on the *same* Console the log handler writes to
(:func:`log_console`): rich prints each log line above the live bars, whole, and a closed phase's bar is
removed, never printed again (its caller logs the result). Redirected (not a terminal), rich would draw the
bars only once, at the end; there each phase logs a plain line instead: at each tenth of the way, and every
``every_s`` seconds for the innermost open phase even while it stands still (a long update, a slow batch).
A phase opened part-way (``done=``, a resumed run) counts its ETA from the work done since.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.text import Text

logger = logging.getLogger(__name__)

Clock = Callable[[], float]


def log_console() -> Console:
    """The Console the root logger's rich handler writes to (``spanlab``'s CLI sets one up), so that bars and
    log lines share it; a new stderr Console when logging goes elsewhere."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, RichHandler):
            return handler.console
    return Console(stderr=True)


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``: short enough for a bar's column and a log line."""
    s = max(round(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass
class Phase:
    """One open phase: what is done of what, since when; ``advance`` and ``note`` are all a caller uses."""

    label: str
    total: int
    done: int
    board: PhaseProgress
    started: float
    start_done: int  # done when the phase opened (a resumed run's earlier steps): not in the rate
    text: str = ""
    task_id: int | None = None  # the rich bar's task (terminal only)
    advanced: float = 0.0  # when the count last moved
    last_line: float = 0.0  # when a plain line last said where this phase is
    last_tenth: int = 0

    def advance(self, n: int = 1, *, note: str | None = None) -> None:
        """``n`` more done (and the note to show beside the count, if given)."""
        self.board.update(self, n, note)

    def note(self, text: str) -> None:
        """What the phase is doing now, without a count (``step 2/3: updating``)."""
        self.board.update(self, 0, text)

    def skip(self, n: int, *, note: str | None = None) -> None:
        """``n`` items that were already done (cached results): counted, but not in the rate the ETA goes by."""
        self.start_done += n
        self.board.update(self, n, note)

    def extend(self, n: int) -> None:
        """``n`` more items than the phase opened with (work found on the way, e.g. rollouts run in the same batch)."""
        self.board.extend(self, n)

    def eta_s(self, now: float) -> float | None:
        """Seconds left at the average rate since the phase opened, counted down since the count last moved;
        None before the first item is done."""
        done_here = self.done - self.start_done
        if done_here <= 0:
            return None
        at_last_move = (self.total - self.done) * (self.advanced - self.started) / done_here
        return max(at_last_move - (now - self.advanced), 0.0)

    def line(self, now: float) -> str:
        """The plain line: ``eval test: 27/90 (30%) accuracy 51.9% | 1m02s elapsed, ETA 2m25s``."""
        eta = self.eta_s(now)
        pct = 100 * self.done // max(self.total, 1)
        note = f" {self.text}" if self.text else ""
        left = "?" if eta is None else duration(eta)
        return f"{self.label}: {self.done}/{self.total} ({pct}%){note} | {duration(now - self.started)} elapsed, " \
               f"ETA {left}"


def running_mean(bar: Phase, note: str, done: Sequence[float] = ()) -> Callable[[float | None], None]:
    """A rollout-ended callback that advances ``bar`` and shows the mean reward so far, formatted by ``note``
    (counting the rewards of items ``done`` before, such as cached ones)."""
    rewards: list[float] = list(done)

    def finished(reward: float | None) -> None:
        rewards.append(reward or 0.0)
        bar.advance(note=note.format(sum(rewards) / len(rewards)))

    return finished


class EtaColumn(ProgressColumn):
    """``ETA 2m25s``, counted down between updates from the phase's average rate (``?`` until one is done)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def render(self, task: Task) -> Text:
        phase: Phase | None = task.fields.get("phase")
        eta = phase.eta_s(self.clock()) if phase is not None else None
        return Text(f"ETA {'?' if eta is None else duration(eta)}", style="progress.remaining")


@dataclass
class PhaseProgress:
    """The job's progress display: rich bars on a terminal, periodic plain log lines otherwise."""

    console: Console
    every_s: float = 30.0  # redirected: the innermost phase says where it is at least this often
    clock: Clock = time.monotonic
    live: bool | None = None  # None: bars when the console is a terminal
    _open: list[Phase] = field(default_factory=list)
    _bars: Progress | None = None
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _ticker: threading.Thread | None = None

    @property
    def bars(self) -> bool:
        return self.console.is_terminal if self.live is None else self.live

    @contextmanager
    def phase(self, label: str, total: int, *, done: int = 0) -> Iterator[Phase]:
        """An open phase of ``total`` items, ``done`` of them already (the bar starts there)."""
        now = self.clock()
        phase = Phase(label, max(total, 0), done, self, now, done, advanced=now, last_line=now,
                      last_tenth=10 * done // max(total, 1))
        with self._lock:
            self._open.append(phase)
            if self.bars:
                phase.task_id = self._live().add_task(label, total=phase.total, completed=done, phase=phase,
                                                      note="")
            else:
                if done:  # a resumed phase says where it starts
                    logger.info("%s", phase.line(now))
                self._start_ticker()
        try:
            yield phase
        finally:
            self._close(phase)

    def update(self, phase: Phase, n: int, note: str | None) -> None:
        with self._lock:
            now = self.clock()
            if n:
                phase.done, phase.advanced = min(phase.done + n, phase.total), now
            if note is not None:
                phase.text = note
            if phase.task_id is not None and self._bars is not None:
                self._bars.update(phase.task_id, completed=phase.done, note=phase.text)
                return
            tenth = 10 * phase.done // max(phase.total, 1)
            if n and tenth > phase.last_tenth:
                phase.last_tenth = tenth
                self._say(phase, now)

    def extend(self, phase: Phase, n: int) -> None:
        with self._lock:
            phase.total += max(n, 0)
            phase.last_tenth = 10 * phase.done // max(phase.total, 1)
            if phase.task_id is not None and self._bars is not None:
                self._bars.update(phase.task_id, total=phase.total)

    def close(self) -> None:
        """Stop the bars and the ticker (the job's end; phases still open are dropped)."""
        self._stop.set()
        with self._lock:
            self._open.clear()
            if self._bars is not None:
                self._bars.stop()
                self._bars = None

    def __enter__(self) -> PhaseProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _say(self, phase: Phase, now: float) -> None:
        phase.last_line = now
        logger.info("%s", phase.line(now))

    def _live(self) -> Progress:
        """The bars, started when the first phase opens; a fresh display after the last one closed."""
        if self._bars is None:
            self._bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[note]}"), TimeElapsedColumn(), EtaColumn(self.clock),
                                  console=self.console, transient=True)
            self._bars.start()
        return self._bars

    def _close(self, phase: Phase) -> None:
        with self._lock:
            if phase in self._open:
                self._open.remove(phase)
            if phase.task_id is not None and self._bars is not None:
                self._bars.remove_task(phase.task_id)
                if not self._open:  # nothing live between phases: log lines print as they would without bars
                    self._bars.stop()
                    self._bars = None

    def _start_ticker(self) -> None:
        if self._ticker is None or not self._ticker.is_alive():
            self._stop.clear()
            self._ticker = threading.Thread(target=self._tick, name="spanlab-progress", daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        """Redirected output: the innermost open phase says where it is when it has been quiet ``every_s``."""
        while not self._stop.wait(min(self.every_s, 1.0)):
            with self._lock:
                if not self._open:
                    continue
                phase, now = self._open[-1], self.clock()
                if now - phase.last_line >= self.every_s:
                    self._say(phase, now)
