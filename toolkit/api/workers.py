"""`--api-workers N`: the OpenAI API as N processes on one port, with one set of metrics and one bound.

At a GPU engine's pace one Python process relays ~10k streamed tokens/s over Triton's HTTP
generate_stream, ~5k over gRPC (~100 and ~190 us of CPU per token, perf/results/api_front_end_gpu_pace.md),
a fraction of what one H100 produces. So the API runs as N
worker processes forked from a supervisor (this module), each its own uvicorn server, event loop,
GIL and gRPC channel to Triton.

- One port: every worker listens on its own socket bound with SO_REUSEPORT, so the kernel spreads
  new connections over them by their address hash. (One shared listening socket spreads them badly:
  with keep-alive, 39 of 40 streams landed on one of two workers in a measurement; uvicorn's own
  workers=N pickles its config, which holds our protocol class and settings, and cannot be used.)
- One set of metrics: prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set by the
  launcher before anything imports prometheus_client), /metrics of any worker renders them all;
  gauges are `livesum`, and a dead worker's live gauges are dropped (mark_process_dead).
- One in-flight bound: --max-in-flight counts requests over all workers, in a slot per worker in
  shared memory; a worker that dies has its slot zeroed, so its requests do not hold the bound.
- One health: a fault or stall of the engine that one worker finds is in shared memory too, and every
  worker's /health checks the engine itself when another found one (SharedFault).
- Stop: SIGTERM/SIGINT/SIGHUP go once to every worker, which drains as one API does; a worker still
  running past the drain timeout is killed. A worker that dies on its own is started again (after a
  pause that grows, and starts over once a worker has lived RESPAWN_RESET_S); one of the first
  workers that dies before it ever served (a bad setting, a taken port) stops the whole API, as a
  lone API would, but a worker started again that dies (killed again while it starts) is started
  again. A worker whose supervisor dies (kill -9) gets SIGTERM from the kernel and drains.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.errors import ServerError
from toolkit.settings import EXIT_TIMEOUT_S, cache_dir
from toolkit.subprocs import die_with_parent_process

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
RESPAWN_PAUSE_S = (1.0, 30.0)  # first pause before starting a dead worker again, and the longest
# A worker that lived this long before it died is started again after the first pause.
RESPAWN_RESET_S = 60.0
POLL_S = 0.2
BACKLOG = 2048
FAULT_BYTES = 512  # the shared fault's text, cut to this


def metrics_dir(port: int) -> Path:
    """Where the workers of the API on `port` keep their metric files (the launcher sets it in their
    environment; the supervisor empties it when it starts: stale files would be summed in)."""
    return cache_dir("api-metrics") / str(port)


@dataclass
class Worker:
    slot: int
    pid: int
    started: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class WorkerSlot:
    """What a worker shares with the others: the in-flight counts, its index in them, and the flag it
    raises once it serves."""

    in_flight: Any  # multiprocessing.Array of c_long, one per worker
    ready: Any  # multiprocessing.Array of c_bool, one per worker
    index: int
    fault: Any = None  # multiprocessing.Array of c_char: why the engine cannot serve ("": it can)

    def serving(self) -> None:
        self.ready[self.index] = True


@dataclass
class Supervisor:
    """Forks and watches the workers; `serve` is the whole life of the API process."""

    workers: int
    host: str
    port: int
    # run in the forked child, on its listening socket; returns the child's exit code
    serve_one: Callable[[socket.socket, WorkerSlot], int]
    drain_timeout_s: int = EXIT_TIMEOUT_S
    slots: Any = None  # multiprocessing.Array of in-flight counts, one per worker
    ready: Any = None  # multiprocessing.Array of c_bool: the worker in that slot has served
    fault: Any = None  # multiprocessing.Array of c_char: the engine's fault, as a worker found it
    running: dict[int, Worker] = field(default_factory=dict)
    stop_signal: int | None = None
    served: set[int] = field(default_factory=set)  # slots whose worker has served at least once

    def serve(self) -> int:
        _empty_metrics_dir()
        self.slots = multiprocessing.Array(ctypes.c_long, self.workers)
        self.ready = multiprocessing.Array(ctypes.c_bool, self.workers)
        self.fault = multiprocessing.Array(ctypes.c_char, FAULT_BYTES)
        previous = {sig: signal.signal(sig, self._on_stop) for sig in _STOPS}
        try:
            for slot in range(self.workers):
                self._spawn(slot)
            return self._watch()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _spawn(self, slot: int) -> None:
        sock = listening_socket(self.host, self.port)
        self.ready[slot] = False
        supervisor = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker
            for sig in _STOPS:
                signal.signal(sig, signal.SIG_DFL)
            _die_with(supervisor)
            code = 1
            try:
                code = self.serve_one(sock, WorkerSlot(self.slots, self.ready, slot, self.fault))
            except BaseException as exc:  # noqa: BLE001 - a forked child must end here, never return
                print(
                    f"API worker {slot}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True
                )
            finally:
                os._exit(code)
        sock.close()  # the worker's alone: connections hashed to it must go to a process that accepts
        self.running[pid] = Worker(slot, pid)

    def _watch(self) -> int:
        pauses: dict[int, float] = {}
        while self.running:
            if self.stop_signal is not None:
                return self._stop_all()
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                time.sleep(POLL_S)
                continue
            worker = self.running.pop(pid, None)
            if worker is None:
                continue
            self._forget(worker)
            if self.stop_signal is not None:
                continue
            code = os.waitstatus_to_exitcode(status)
            if self.ready[worker.slot]:
                self.served.add(worker.slot)
            elif worker.slot not in self.served:
                print(
                    f"API worker {worker.slot} (pid {pid}) exited with code {code} before it served: "
                    "stopping the API",
                    file=sys.stderr,
                    flush=True,
                )
                self._stop_all()
                return 1
            lived = time.monotonic() - worker.started
            earlier = 0.0 if lived >= RESPAWN_RESET_S else pauses.get(worker.slot, 0.0)
            pause = min(RESPAWN_PAUSE_S[1], max(RESPAWN_PAUSE_S[0], 2 * earlier))
            pauses[worker.slot] = pause
            print(
                f"API worker {worker.slot} (pid {pid}) exited with code {code}; starting it again in "
                f"{pause:g} s",
                file=sys.stderr,
                flush=True,
            )
            self._pause(pause)
            if self.stop_signal is None:
                self._spawn(worker.slot)
        return 0

    def _pause(self, seconds: float) -> None:
        """Sleep, but wake for a stop signal."""
        deadline = time.monotonic() + seconds
        while self.stop_signal is None and time.monotonic() < deadline:
            time.sleep(POLL_S)

    def _forget(self, worker: Worker) -> None:
        """A worker is gone: its live gauges and its share of the in-flight bound with it."""
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
        self.slots[worker.slot] = 0

    def _on_stop(self, signum, _frame) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum
        else:  # a second signal: stop at once
            for pid in list(self.running):
                _kill(pid, signal.SIGKILL)

    def _stop_all(self) -> int:
        """SIGTERM once to each worker (each drains), SIGKILL what still runs past the drain."""
        for pid in list(self.running):
            _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.drain_timeout_s + 5
        failed = False
        while self.running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                if time.monotonic() > deadline:
                    for left in list(self.running):
                        _kill(left, signal.SIGKILL)
                    deadline = float("inf")
                time.sleep(POLL_S)
                continue
            worker = self.running.pop(pid, None)
            if worker is not None:
                self._forget(worker)
                failed = failed or os.waitstatus_to_exitcode(status) not in (0, -signal.SIGTERM)
        return 1 if failed else 0


_STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _die_with(supervisor: int) -> None:
    """In a worker: SIGTERM (a drain) from the kernel when the supervisor dies, so that a kill -9 of it
    leaves no worker serving the port; and at once if it already died between the fork and this."""
    if die_with_parent_process(signal.SIGTERM) and os.getppid() != supervisor:
        os.kill(os.getpid(), signal.SIGTERM)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _empty_metrics_dir() -> None:
    folder = os.environ.get(METRICS_DIR_ENV)
    if not folder:
        raise ServerError(
            f"API workers need {METRICS_DIR_ENV} in their environment before they start",
            hint="start them with toolkit api --workers N or toolkit serve --api-workers N",
        )
    path = Path(folder)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, mode=0o700)


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound with SO_REUSEPORT to host:port, listening: one of the port's group."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise ServerError(
            f"the API workers cannot listen on {host}:{port}: {exc.strerror}",
            hint="is the port taken? pick another with --port",
        ) from exc
    sock.set_inheritable(False)
    return sock


class SharedInFlight:
    """Requests in flight over all workers: one slot per worker in shared memory, summed under its lock."""

    def __init__(self, worker: WorkerSlot):
        self.slots = worker.in_flight
        self.slot = worker.index

    def acquire(self, limit: int) -> bool:
        with self.slots.get_lock():
            if sum(self.slots) >= limit:
                return False
            self.slots[self.slot] += 1
            return True

    def release(self) -> None:
        with self.slots.get_lock():
            self.slots[self.slot] = max(0, self.slots[self.slot] - 1)

    @property
    def count(self) -> int:
        return sum(self.slots)


class SharedFault:
    """Why the engine cannot serve, as any worker last found it ("" when it can): each worker sees only
    its own requests fail, so without it /health answered 503 from the worker that saw a dead engine and
    200 from the others, by connection."""

    def __init__(self, worker: WorkerSlot):
        self.text = worker.fault

    @property
    def raised(self) -> bool:
        """Lock-free: read on every request's end."""
        return self.text[0] != b"\x00"

    def get(self) -> str:
        with self.text.get_lock():
            return self.text.value.decode("utf-8", "replace")

    def set(self, message: str) -> None:
        with self.text.get_lock():
            self.text.value = message.encode("utf-8")[: FAULT_BYTES - 1]

    def clear(self) -> None:
        with self.text.get_lock():
            self.text.value = b""
