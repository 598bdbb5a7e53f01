"""A Python-backend stub never outlives its tritonserver (model_repo/common/lifetime.py), even when its
Python cannot run.

Reproduced in the suite (tests/test_bench_docs.py, a sweep whose `toolkit serve` is killed): 1 run in
4 left a preprocessing stub parented to init, alive minutes later and holding its /dev/shm region. Its
main thread was in the stub's exit, holding the GIL, and the watcher thread sat in time.sleep waiting
for the GIL for good. Here a stand-in stub binds itself as a model does, then holds the GIL in a C call
(ctypes.PyDLL does not release it) while its stand-in server is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

from toolkit.subprocs import process_alive

COMMON = Path(__file__).resolve().parents[1] / "model_repo" / "common"

STUB = textwrap.dedent(
    """
    import ctypes, mmap, os, sys
    sys.path.insert(0, sys.argv[1])
    region = sys.argv[2]
    with open(region, "wb") as f:
        f.truncate(4096)
    with open(region, "r+b") as f:
        mapped = mmap.mmap(f.fileno(), 4096)  # mapped, as the backend maps its region
    from lifetime import bind_to_server
    bind_to_server()
    print(os.getpid(), flush=True)
    ctypes.PyDLL(None).sleep(600)  # in C, holding the GIL: no Python thread of this process runs
    """
)

SERVER = textwrap.dedent(
    """
    import subprocess, sys
    stub = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]],
                            stdout=subprocess.PIPE, text=True)
    print(stub.stdout.readline().strip(), flush=True)
    stub.wait()
    """
)


def _stand_ins(region: Path) -> tuple[subprocess.Popen, int]:
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, STUB, str(COMMON), str(region)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    line = server.stdout.readline()
    if not line.strip().isdigit():  # the stand-in stub failed: leave nothing behind
        server.kill()
        server.wait()
        region.unlink(missing_ok=True)
        raise AssertionError(f"the stand-in stub did not start: {line!r}")
    return server, int(line)


def _gone_within(pid: int, bound_s: float) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_a_stub_whose_python_cannot_run_still_dies_with_its_server_and_takes_its_region():
    region = Path(f"/dev/shm/toolkit_test_{uuid.uuid4().hex}")
    server, stub = _stand_ins(region)
    try:
        assert region.exists() and process_alive(stub)
        assert oct(region.stat().st_mode & 0o777) == oct(0o600)  # made owner-only as it bound
        time.sleep(1.0)
        assert process_alive(stub), "the stub died while its server ran"
        os.kill(server.pid, signal.SIGKILL)
        server.wait(10)
        assert _gone_within(stub, 5), "the stub outlived its server"
        assert not region.exists(), "its shared-memory region was left behind"
    finally:
        if process_alive(stub):
            os.kill(stub, signal.SIGKILL)
        region.unlink(missing_ok=True)
        if server.poll() is None:
            server.kill()
            server.wait()


def _watcher_of(stub: int) -> int:
    """The stub's watcher, once it is the shell and ignores stop signals (its first line: a signal in
    the moments before, while it starts, would end it)."""
    deadline = time.monotonic() + 10
    while True:
        watchers = [
            pid
            for pid in (int(p) for p in os.listdir("/proc") if p.isdigit())
            if _ppid(pid) == stub
        ]
        assert len(watchers) == 1, watchers
        if _ignores(watchers[0], signal.SIGTERM) or time.monotonic() > deadline:
            return watchers[0]
        time.sleep(0.05)


def _ignores(pid: int, sig: int) -> bool:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << (sig - 1)))
    except OSError:
        return False
    return False


def test_the_watcher_outlives_the_stop_signal_its_server_group_gets():
    """serve SIGTERMs tritonserver's group on a stop, watchers included (the stub ignores it; a shell
    would die). A serve killed during that drain leaves the stubs to their watchers."""
    region = Path(f"/dev/shm/toolkit_test_{uuid.uuid4().hex}")
    server, stub = _stand_ins(region)
    try:
        watcher = _watcher_of(stub)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            os.kill(watcher, sig)
        time.sleep(1.0)
        assert process_alive(watcher), "a stop signal ended the watcher"
        os.kill(server.pid, signal.SIGKILL)
        server.wait(10)
        assert _gone_within(stub, 5), "the stub outlived its server"
        assert not region.exists()
    finally:
        if process_alive(stub):
            os.kill(stub, signal.SIGKILL)
        region.unlink(missing_ok=True)
        if server.poll() is None:
            server.kill()
            server.wait()


def test_the_watcher_ends_with_its_stub_and_leaves_the_region_to_its_server():
    """A stub that exits on its own (a clean unload) takes its watcher with it, and unlinks nothing:
    the region is the server's to remove then."""
    region = Path(f"/dev/shm/toolkit_test_{uuid.uuid4().hex}")
    server, stub = _stand_ins(region)
    try:
        watcher = _watcher_of(stub)
        os.kill(stub, signal.SIGKILL)
        server.wait(10)
        assert _gone_within(watcher, 5), "the watcher outlived its stub"
        assert region.exists()
    finally:
        region.unlink(missing_ok=True)
        if server.poll() is None:
            server.kill()
            server.wait()


def _ppid(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None
