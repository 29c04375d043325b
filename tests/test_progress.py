"""Progress of the long phases (:mod:`spanlab.progress`): plain lines with an ETA when output is redirected,
bars on the log handler's console on a terminal, and a resumed step loop's bar starting at its step.

The consoles write to real in-memory files (a terminal one with ``force_terminal``), the logging is the
CLI's (a ``RichHandler`` on the root logger), and the step loop is the real ``Job.steps`` on a parsed
tutorial config and its real task splits; only the engine-side parts of the job are left out (unused here).
"""

from __future__ import annotations

import io
import logging
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from rich.console import Console
from rich.logging import RichHandler

from spanlab.config import load_yaml
from spanlab.jobs.config import parse_train_config
from spanlab.jobs.job import Job, split_tasks
from spanlab.jobs.report import TrainReport
from spanlab.jobs.tasks import load_task_set
from spanlab.progress import PhaseProgress, duration, log_console

QUICK = Path(__file__).resolve().parents[1] / "tutorials" / "calc" / "quick.yaml"


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def progress_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "spanlab.progress"]


def test_redirected_output_gets_a_line_each_tenth_and_when_quiet_with_an_eta(
        caplog: pytest.LogCaptureFixture) -> None:
    out, clock = io.StringIO(), ManualClock()
    caplog.set_level(logging.INFO, logger="spanlab.progress")
    with PhaseProgress(Console(file=out), every_s=30.0, clock=clock) as progress, \
            progress.phase("final eval test", 20) as bar:
        for i in range(10):  # 2 s per task
            clock.now += 2.0
            bar.advance(note=f"accuracy {100 * (i % 2):.1f}%")
        assert progress_lines(caplog) == [
            f"final eval test: {k}/20 ({5 * k}%) accuracy {100 * ((k - 1) % 2):.1f}% | {duration(2 * k)} elapsed, "
            f"ETA {duration(2 * (20 - k))}" for k in (2, 4, 6, 8, 10)]
        clock.now += 31.0  # a stall: the ticker says where the phase is, the ETA counted down (floored at 0)
        deadline = time.monotonic() + 5.0
        while len(progress_lines(caplog)) == 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert progress_lines(caplog)[5] == "final eval test: 10/20 (50%) accuracy 100.0% | 51s elapsed, ETA 0s"
    assert out.getvalue() == ""  # no bar was drawn into the redirected output


@pytest.fixture
def terminal_logging() -> Iterator[tuple[Console, io.StringIO]]:
    """The CLI's logging (a RichHandler on the root logger) on a terminal console writing to memory."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=140)
    handler = RichHandler(console=console, show_path=False)
    root = logging.getLogger()
    level, root.level = root.level, logging.INFO
    root.addHandler(handler)
    yield console, out
    root.removeHandler(handler)
    root.setLevel(level)


def test_bars_share_the_log_console_keep_log_lines_whole_and_vanish_when_done(
        terminal_logging: tuple[Console, io.StringIO]) -> None:
    console, out = terminal_logging
    assert log_console() is console
    log = logging.getLogger("spanlab.test")
    with PhaseProgress(log_console()) as progress:
        with progress.phase("warm start (SFT)", 4) as bar:
            for step in range(4):
                time.sleep(0.15)
                bar.advance(note=f"loss {1 / (step + 1):.3f}")
                log.info("weights from runs/dp/weights pushed (%d)", step)
        log.info("held-out accuracy on test 50.0% after the warm start")
        time.sleep(0.3)
        log.info("a later line")
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # the colours and cursor moves
    for step in range(4):  # whole: the line starts right after the handler's level column
        assert text.count(f"INFO     weights from runs/dp/weights pushed ({step})") == 1
    assert "ETA" in text and "loss 0." in text
    after = text[text.index("held-out accuracy on test"):]
    assert "warm start (SFT)" not in after  # the finished bar is not drawn again after later log lines


def test_a_resumed_step_loop_starts_its_bar_at_the_step_it_resumes_from(caplog: pytest.LogCaptureFixture) -> None:
    config = parse_train_config(load_yaml(QUICK), str(QUICK))
    task_set = load_task_set(config.dataset.name)
    report = TrainReport(run_name="t", algorithm="grpo", model="m", db="d.duckdb")
    report.steps.append({"reward_mean": 0.25})  # the run was killed after its first of 3 steps
    caplog.set_level(logging.INFO, logger="spanlab.progress")
    with ExitStack() as stack:
        progress = stack.enter_context(PhaseProgress(Console(file=io.StringIO()), every_s=3600.0))
        job = Job(config, None, task_set, split_tasks(task_set, config, 16), report, progress,  # type: ignore[arg-type]
                  stack)
        ran = []
        for step, tasks in job.steps(3, 4, "GRPO"):
            assert len(tasks) == 4
            ran.append(step)
            report.steps.append({"reward_mean": 0.5})
    assert ran == [1, 2]
    lines = progress_lines(caplog)
    assert lines[0].startswith("GRPO: 1/3 (33%) | ") and lines[0].endswith("ETA ?"), lines
    assert lines[1].startswith("GRPO: 2/3 (66%) reward 0.50 | "), lines
    assert lines[-1].startswith("GRPO: 3/3 (100%)"), lines


def test_a_resumed_bar_on_a_terminal_shows_the_done_steps() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=140)
    with PhaseProgress(console) as progress, progress.phase("GRPO", 3, done=1) as bar:
        assert bar.eta_s(time.monotonic()) is None  # nothing done in this session yet: no rate to go by
        bars = progress._bars
        assert bars is not None and [t.completed for t in bars.tasks] == [1]
        bar.advance()
        assert [t.completed for t in bars.tasks] == [2]


def test_a_phase_extended_on_the_way_counts_to_its_new_total(caplog: pytest.LogCaptureFixture) -> None:
    """APO's held-out evaluation also runs the search's first rollouts in its batch: the bar grows to count them."""
    clock = ManualClock()
    caplog.set_level(logging.INFO, logger="spanlab.progress")
    with PhaseProgress(Console(file=io.StringIO()), every_s=3600.0, clock=clock) as progress, \
            progress.phase("base eval test", 10) as bar:
        bar.extend(10)
        bar.skip(5)  # cached pairs: counted at once, not in the rate
        assert (bar.done, bar.total) == (5, 20)
        for _ in range(15):
            clock.now += 1.0
            bar.advance()
    lines = progress_lines(caplog)
    assert lines[:3] == ["base eval test: 5/20 (25%) | 0s elapsed, ETA ?",  # tenths of the new total
                         "base eval test: 6/20 (30%) | 1s elapsed, ETA 14s",  # 1 s per item actually run
                         "base eval test: 8/20 (40%) | 3s elapsed, ETA 12s"], lines
    assert lines[-1].startswith("base eval test: 20/20 (100%)"), lines
    console = Console(file=io.StringIO(), force_terminal=True, width=140)
    with PhaseProgress(console) as progress, progress.phase("eval", 2) as bar:
        bar.extend(3)
        assert progress._bars is not None and [t.total for t in progress._bars.tasks] == [5]


def test_a_step_note_names_the_open_step(caplog: pytest.LogCaptureFixture) -> None:
    """The async loop's take says how many groups are ready, on the step bar: ``step 2/3: 1/4 groups ready``."""
    config = parse_train_config(load_yaml(QUICK), str(QUICK))
    task_set = load_task_set(config.dataset.name)
    report = TrainReport(run_name="t", algorithm="grpo", model="m", db="d.duckdb")
    with ExitStack() as stack:
        progress = stack.enter_context(PhaseProgress(Console(file=io.StringIO()), every_s=3600.0))
        job = Job(config, None, task_set, split_tasks(task_set, config, 16), report, progress,  # type: ignore[arg-type]
                  stack)
        job.step_note("ignored: no step loop is open")
        notes = []
        for _step, _tasks in job.steps(3, 4, "GRPO async"):
            job.step_note("1/4 groups ready")
            assert job._steps_bar is not None
            notes.append(job._steps_bar.text)
            report.steps.append({"reward_mean": 0.5})
    assert notes == ["step 1/3: 1/4 groups ready", "step 2/3: 1/4 groups ready", "step 3/3: 1/4 groups ready"]


def test_log_lines_to_a_file_or_pipe_are_whole_lines_and_a_terminal_gets_rich() -> None:
    from spanlab.cli import log_handler

    out = io.StringIO()
    handler = log_handler(Console(file=out))  # not a terminal: a log file, a pipe
    line = "GRPO: 2/9 (22%) reward 0.47 | 7m07s elapsed, ETA 24m55s " + "and a long tail" * 10
    handler.handle(logging.LogRecord("spanlab.x", logging.INFO, __file__, 1, line, None, None))
    (written,) = out.getvalue().splitlines()  # one line, not wrapped at 80 columns, not padded to a width
    assert written.endswith(f"INFO    {line}") and not written.endswith(" ")
    assert isinstance(log_handler(Console(file=io.StringIO(), force_terminal=True)), RichHandler)
