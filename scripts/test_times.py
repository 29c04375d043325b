"""Where the test suite's time goes: pytest's durations grouped by the vLLM server a test starts or uses, and by the
SFT warm start it trains.

Why: most of the suite's wall time is engine starts and CPU training, and a flat ``--durations`` list does not say
which tests share an engine or a warm start (a module fixture's start lands on its first test only). This runs
pytest in this process with a small plugin that

* watches ``/proc`` (once a second) for new ``vllm.entrypoints.openai.api_server`` processes of this run and
  charges each start to the fixture being set up at that moment (``tests/gateway/test_tiny_model.py::tiny_server``),
  or to the test itself when it starts one in its body or in a subprocess (a job with its own engine, a restart);
* counts the session server (``vllm_server``, ``upstream``: started in the background at collection,
  tests/engine_fixtures.py) as the group of every test that asks for it, its first start as nobody's;
* times each call of :func:`spanlab.training.policy.warm_start` made in this process (the jobs tests run
  ``run_job`` in-process; a warm start inside a ``spanlab train`` subprocess is not seen).

Each test lands in one engine group: the engine fixtures it depends on, else the servers it started itself, else
``no engine``. Run it from the repo root with pytest's own arguments (everything after the options below):

    PYTHONPATH=. .venv/bin/python scripts/test_times.py tests/engine tests/gateway/test_tiny_model.py
    PYTHONPATH=. .venv/bin/python scripts/test_times.py --json /tmp/times.json -- tests -x

It prints the groups and the slowest tests; ``--json`` also writes every test's record. Timings on a loaded
machine are not the suite's: measure on idle cores (the issue-54 target is the README's test command on 2).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

logger = logging.getLogger("test_times")
API_SERVER = "vllm.entrypoints.openai.api_server"
SESSION_FIXTURES = frozenset({"vllm_server", "upstream"})  # the one session server, started at collection
SESSION_GROUP = "session server (vllm_server)"


@dataclass
class TestRecord:
    """One test's phases (seconds), the engine fixtures in its closure and what it started or trained itself."""

    nodeid: str
    setup: float = 0.0
    call: float = 0.0
    teardown: float = 0.0
    outcome: str = "passed"
    engine_fixtures: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)  # servers that appeared during this test, by label
    warm_starts: list[tuple[str, float]] = field(default_factory=list)  # (key, seconds)

    @property
    def total(self) -> float:
        return self.setup + self.call + self.teardown


def server_label(argv: list[str]) -> str:
    """A vLLM command line in a few words: served name, then the flags that make servers unshareable."""
    def value(flag: str) -> str | None:
        return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None

    name = value("--served-model-name") or Path(value("--model") or "?").name
    parts = [name, f"len={value('--max-model-len')}"]
    parts += [f"parser={p}" for p in [value("--tool-call-parser")] if p]
    parts += [flag.removeprefix("--") for flag in ("--enable-lora", "--enable-scale-out") if flag in argv]
    return " ".join(parts)


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _descends_from(pid: int, root: int) -> bool:
    while pid > 1:
        if pid == root:
            return True
        pid = _parent(pid)
    return False


def _api_servers(root: int) -> dict[int, list[str]]:
    """vLLM API servers under process ``root``: pid -> argv. Only ``python -m <api_server>`` itself counts (not
    the guard whose argv names it), and only this run's: other people's servers on the machine are not."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = [a for a in (proc / "cmdline").read_bytes().decode(errors="replace").split("\0") if a]
        except OSError:
            continue
        if argv[1:3] == ["-m", API_SERVER] and _descends_from(int(proc.name), root):
            found[int(proc.name)] = argv
    return found


def _session_server_pids(config: pytest.Config | None) -> set[int]:
    """The processes of the session server this run started at collection (tests/engine_fixtures.py), if any."""
    try:
        from tests.engine_fixtures import session_server
    except ImportError:  # run outside this repo's tests
        return set()
    server = session_server(config) if config is not None else None
    return set(server.pids()) if server is not None else set()


class TimesPlugin:
    """The pytest plugin: phase durations, engine starts charged to fixture or test, warm starts timed."""

    def __init__(self, poll_s: float = 1.0) -> None:
        self.records: dict[str, TestRecord] = {}
        self.fixture_starts: dict[str, list[str]] = defaultdict(list)  # "baseid::fixture" -> server labels
        self.unattributed: list[str] = []  # started outside any test (the session server at collection)
        self._current: str | None = None
        self._fixtures: list[str] = []  # fixtures being set up, innermost last
        self._root = os.getpid()
        self._seen = set(_api_servers(self._root))  # servers running before the run are nobody's
        self._config: pytest.Config | None = None
        self._session_seen = False  # the session server's first start is the collection's, its restarts a test's
        self._stop = threading.Event()
        self._poll_s = poll_s
        self._thread = threading.Thread(target=self._watch, name="test-times-watch", daemon=True)
        self._unpatch: Callable[[], None] | None = None

    # -- engine starts -------------------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            for pid, argv in _api_servers(self._root).items():
                if pid not in self._seen:
                    self._seen.add(pid)
                    self._charge(server_label(argv), session=pid in _session_server_pids(self._config))

    def _charge(self, label: str, *, session: bool) -> None:
        if session and not self._session_seen:  # started in the background at collection, for every engine test
            self._session_seen = True
            self.unattributed.append(label)
        elif self._fixtures:
            self.fixture_starts[self._fixtures[-1]].append(label)
        elif self._current is not None:
            self.records[self._current].started.append(label)
        else:
            self.unattributed.append(label)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any]) -> Iterator[None]:
        self._fixtures.append(f"{fixturedef.baseid or '<conftest>'}::{fixturedef.argname}")
        try:
            yield
        finally:
            self._fixtures.pop()

    # -- tests -------------------------------------------------------------------------------------------
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self._config = session.config
        self._thread.start()
        self._unpatch = self._patch_warm_start()

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self._stop.set()
        self._thread.join()
        if self._unpatch is not None:
            self._unpatch()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        self.records[item.nodeid] = TestRecord(item.nodeid)
        self._current = item.nodeid
        yield
        self._current = None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = self.records.setdefault(report.nodeid, TestRecord(report.nodeid))
        setattr(record, report.when, getattr(record, report.when) + report.duration)
        if report.failed or (report.skipped and report.when != "teardown"):
            record.outcome = report.outcome

    def _patch_warm_start(self) -> Callable[[], None] | None:
        """Wrap ``warm_start`` (the job imports it from its module at call time) to time each call."""
        try:
            from spanlab.training import policy
        except ImportError:  # no torch here: nothing trains in this run
            return None
        original = policy.warm_start

        def timed(*args: Any, **kwargs: Any) -> Any:
            demonstration = args[1] if len(args) > 1 else kwargs.get("demonstration")
            key = f"{getattr(demonstration, '__module__', '?')} demos={kwargs.get('demos')}"
            started = time.monotonic()
            try:
                return original(*args, **kwargs)
            finally:
                if self._current is not None:
                    self.records[self._current].warm_starts.append((key, time.monotonic() - started))

        policy.warm_start = timed

        def unpatch() -> None:
            policy.warm_start = original
        return unpatch

    def finish(self, items: list[pytest.Item]) -> None:
        """Each test's engine fixtures: those of its closure that started a server, or the session server's."""
        for item in items:
            record = self.records.get(item.nodeid)
            if record is None:
                continue
            names = set(getattr(item, "fixturenames", ()))
            mine = {key for key in self.fixture_starts
                    if key.rsplit("::", 1)[1] in names and _visible(key.rsplit("::", 1)[0], item.nodeid)}
            record.engine_fixtures = sorted(mine | ({SESSION_GROUP} if names & SESSION_FIXTURES else set()))


def _visible(baseid: str, nodeid: str) -> bool:
    """Whether a fixture defined at ``baseid`` (a module, a conftest's folder, or the root) reaches ``nodeid``."""
    return baseid == "<conftest>" or nodeid == baseid or nodeid.startswith((f"{baseid}::", f"{baseid}/"))


class ItemsPlugin:
    """Keeps the collected items (the times plugin needs each one's fixture closure after the run)."""

    def __init__(self) -> None:
        self.items: list[pytest.Item] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.items = list(session.items)


def engine_group(record: TestRecord) -> str:
    if record.engine_fixtures:
        return " + ".join(record.engine_fixtures)
    if record.started:
        return "own: " + ", ".join(sorted(set(record.started)))
    return "no engine"


def report(plugin: TimesPlugin, wall_s: float, top: int) -> str:
    """The groups, the warm starts and the slowest tests as plain text."""
    records = list(plugin.records.values())
    total = sum(r.total for r in records) or 1.0
    lines = [f"{len(records)} tests, {total:.0f} s in tests, {wall_s:.0f} s wall", "", "By engine:"]
    groups: dict[str, list[TestRecord]] = defaultdict(list)
    for r in records:
        groups[engine_group(r)].append(r)
    for name, members in sorted(groups.items(), key=lambda kv: -sum(r.total for r in kv[1])):
        seconds = sum(r.total for r in members)
        lines.append(f"  {seconds:8.1f} s {100 * seconds / total:5.1f}%  {len(members):4d} tests  {name}")
    lines.append("Servers started (by fixture, by test, at collection):")
    for key, labels in sorted(plugin.fixture_starts.items()):
        lines.append(f"  {len(labels)} x {key}: {'; '.join(labels)}")
    for r in records:
        if r.started:
            lines.append(f"  {len(r.started)} x {r.nodeid}: {'; '.join(r.started)}")
    if plugin.unattributed:
        lines.append(f"  {len(plugin.unattributed)} at collection (the session server): "
                     f"{'; '.join(plugin.unattributed)}")
    warm: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for r in records:
        for key, seconds in r.warm_starts:
            warm[key].append((r.nodeid, seconds))
    lines.append("Warm starts (in this process):" if warm else "Warm starts: none in this process")
    for key, runs in sorted(warm.items()):
        lines.append(f"  {key}: {len(runs)} x, {sum(s for _, s in runs):.1f} s: "
                     + ", ".join(f"{nodeid} {s:.1f}s" for nodeid, s in runs))
    lines.append(f"Slowest {top} tests (setup / call / teardown):")
    for r in sorted(records, key=lambda r: -r.total)[:top]:
        lines.append(f"  {r.total:7.1f} s ({r.setup:.1f} / {r.call:.1f} / {r.teardown:.1f}) {r.outcome:7s} "
                     f"{r.nodeid}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write every test's record here")
    parser.add_argument("--top", type=int, default=20, help="how many of the slowest tests to list")
    args, pytest_args = parser.parse_known_args(argv)
    pytest_args = [a for a in pytest_args if a != "--"]
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    times, items = TimesPlugin(), ItemsPlugin()
    started = time.monotonic()
    code = pytest.main(["-q", *pytest_args], plugins=[times, items])
    times.finish(items.items)
    sys.stdout.write(report(times, time.monotonic() - started, args.top) + "\n")
    if args.json:
        args.json.write_text(json.dumps({"tests": [asdict(r) | {"group": engine_group(r)}
                                                   for r in times.records.values()],
                                         "fixture_starts": times.fixture_starts,
                                         "unattributed": times.unattributed}, indent=1))
        logger.info("records written to %s", args.json)
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
