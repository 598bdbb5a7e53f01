"""Starting and stopping what we started: every tool and server runs in its own session.

A child gets the parent-death signal (it is killed when the toolkit process dies, even by SIGKILL),
and stopping it ends its whole session: the processes it started too (Python-backend stubs, MPI
ranks), also when the leader has already exited. The session, not the process group: mpirun puts
each rank in a process group of its own (setpgid), but every process stays in the session unless it
calls setsid.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1
_GROUP_GONE_POLL_S = 0.1
_GIVE_UP_POLL_S = 0.5


def start_process(
    argv: list[str],
    log_file: Path,
    env: dict | None = None,
    *,
    stdin=subprocess.DEVNULL,
    die_with_parent: bool = True,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen:
    """Start `argv` in a new session, output appended to `log_file`; killed if we die, unless it is to outlive
    us on purpose (`toolkit serve --background`). The parent-death signal follows the starting thread:
    start long-lived children from the main thread."""
    with open(log_file, "ab") as log:
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=stdin,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent_process if die_with_parent else None,
            pass_fds=pass_fds,
        )


def die_with_parent_process(sig: int = signal.SIGKILL) -> bool:
    """In a child: the kernel sends it `sig` when the thread that started it ends (its parent dies).
    False where that cannot be asked (not Linux: the parent's own stops still reach it)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        return False
    return True


def stop_process(
    process: subprocess.Popen,
    timeout_s: float = 20.0,
    *,
    give_up: Callable[[], bool] | None = None,
) -> int | None:
    """terminate -> wait -> kill, for the whole session the child leads (start_new_session=True).

    The session is ended even when the leader is gone already: a tritonserver killed by a signal leaves
    its stubs behind in it, and they must not outlive us. `give_up`, asked every half second while it
    is waited for: True kills it then, before `timeout_s` (it waits on nothing worth waiting for).
    """
    if process.poll() is None:
        # SIGTERM once, to the leader's group (tritonserver and its stubs; mpirun, which forwards it to
        # its ranks): a process that gets it twice may take the second as "stop at once".
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                process.wait(min(_GIVE_UP_POLL_S, max(0.0, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline or (give_up is not None and give_up()):
                    signal_session(process.pid, signal.SIGKILL)
                    process.wait(10)
                    break
    end_session(process.pid, grace_s=min(timeout_s, 5.0))
    return process.returncode


def end_session(sid: int, grace_s: float = 5.0) -> None:
    """SIGTERM what is left of a session, then SIGKILL what is still there after `grace_s`."""
    if not session_alive(sid):
        return
    signal_session(sid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while session_alive(sid) and time.monotonic() < deadline:
        time.sleep(_GROUP_GONE_POLL_S)
    signal_session(sid, signal.SIGKILL)


def session_alive(sid: int) -> bool:
    """Whether any process of the session still runs (zombies of our own children excepted)."""
    return any(_state(pid) not in ("Z", None) for pid in session_members(sid))


# Indexes into _stat_fields: state, ppid, pgrp, session, ...
_PPID_FIELD = 1
_PGRP_FIELD = 2
_SESSION_FIELD = 3


def session_members(sid: int) -> list[int]:
    """Every process of the session `sid` (a child started with start_new_session: its pid), from /proc."""
    return _processes_where(_SESSION_FIELD, sid)


def children_of(pid: int) -> list[int]:
    """Direct children of `pid` (from /proc)."""
    return _processes_where(_PPID_FIELD, pid)


def _processes_where(field: int, value: int) -> list[int]:
    """The pids whose /proc/PID/stat field `field` (a _stat_fields index) is `value`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields and int(fields[field]) == value:
                found.append(int(entry))
    return found


def command_line(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def signal_session(sid: int, sig: int) -> None:
    """`sig` to every process of the session, once each: its leader's group at once, then the
    processes of any other group in it (mpirun's ranks)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, sig)
    for pid in session_members(sid):
        fields = _stat_fields(pid)
        if fields is None or int(fields[_PGRP_FIELD]) == sid:
            continue  # gone, or in the leader's group: signalled above
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _stat_fields(pid: int) -> list[str] | None:
    """state, ppid, pgrp, session, ... of /proc/PID/stat (the fields after the command name)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def process_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    return _state(pid) not in ("Z", "X", None)


def process_stopped(pid: int) -> bool:
    """Whether `pid` is stopped by a signal (SIGSTOP, SIGTSTP; state T), not traced by a debugger (t)."""
    return _state(pid) == "T"


def _state(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def tail_lines(path: Path, lines: int = 20) -> list[str]:
    """The last `lines` lines of a log file ([] when it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 256 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]
