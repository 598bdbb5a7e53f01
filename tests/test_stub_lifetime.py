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
from dataclasses import dataclass
from pathlib import Path

import pytest

from toolkit.subprocs import children_of, process_alive

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


@dataclass
class StandIns:
    region: Path
    server: subprocess.Popen
    stub: int


@pytest.fixture
def stand_ins():
    """A stand-in server and its bound stand-in stub, mapping a region; none of them outlives the test."""
    region = Path(f"/dev/shm/toolkit_test_{uuid.uuid4().hex}")
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, STUB, str(COMMON), str(region)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    line = server.stdout.readline()
    started = StandIns(region, server, int(line)) if line.strip().isdigit() else None
    try:
        assert started is not None, f"the stand-in stub did not start: {line!r}"
        yield started
    finally:
        if started is not None and process_alive(started.stub):
            os.kill(started.stub, signal.SIGKILL)
        region.unlink(missing_ok=True)
        if server.poll() is None:
            server.kill()
            server.wait()


def _gone_within(pid: int, bound_s: float) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_a_stub_whose_python_cannot_run_still_dies_with_its_server_and_takes_its_region(stand_ins):
    assert stand_ins.region.exists() and process_alive(stand_ins.stub)
    assert oct(stand_ins.region.stat().st_mode & 0o777) == oct(0o600)  # made owner-only as it bound
    time.sleep(1.0)
    assert process_alive(stand_ins.stub), "the stub died while its server ran"
    os.kill(stand_ins.server.pid, signal.SIGKILL)
    stand_ins.server.wait(10)
    assert _gone_within(stand_ins.stub, 5), "the stub outlived its server"
    assert not stand_ins.region.exists(), "its shared-memory region was left behind"


def _watcher_of(stub: int) -> int:
    """The stub's watcher, once it is the shell and ignores stop signals (its first line: a signal in
    the moments before, while it starts, would end it)."""
    deadline = time.monotonic() + 10
    while True:
        watchers = children_of(stub)
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


def test_the_watcher_outlives_the_stop_signal_its_server_group_gets(stand_ins):
    """serve SIGTERMs tritonserver's group on a stop, watchers included (the stub ignores it; a shell
    would die). A serve killed during that drain leaves the stubs to their watchers."""
    watcher = _watcher_of(stand_ins.stub)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        os.kill(watcher, sig)
    time.sleep(1.0)
    assert process_alive(watcher), "a stop signal ended the watcher"
    os.kill(stand_ins.server.pid, signal.SIGKILL)
    stand_ins.server.wait(10)
    assert _gone_within(stand_ins.stub, 5), "the stub outlived its server"
    assert not stand_ins.region.exists()


def test_the_watcher_ends_with_its_stub_and_leaves_the_region_to_its_server(stand_ins):
    """A stub that exits on its own (a clean unload) takes its watcher with it, and unlinks nothing:
    the region is the server's to remove then."""
    watcher = _watcher_of(stand_ins.stub)
    os.kill(stand_ins.stub, signal.SIGKILL)
    stand_ins.server.wait(10)
    assert _gone_within(watcher, 5), "the watcher outlived its stub"
    assert stand_ins.region.exists()
