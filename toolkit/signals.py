"""Stop signals, one home: what SIGINT, SIGTERM and SIGHUP do to a toolkit process.

- By default (`stop_signals_raise`, installed by the `toolkit` entry point) SIGTERM and SIGHUP raise
  `Stopped` in the main thread, as SIGINT raises KeyboardInterrupt: every `finally` and
  `except BaseException` clean-up runs (child process groups ended, staging folders removed) instead
  of the process dying where it stands and leaving its children and files behind.
- `deferred_interrupts` holds them during a short step that must finish (a swap into place).
- `toolkit serve` replaces them while it serves: the first drains, a second stops at once
  (serve/lifecycle.py).
A signal the process inherited as ignored (`nohup` ignores SIGHUP) stays ignored everywhere: `replace`.
SIGUSR1 writes every thread's Python stack to stderr (`dump_stacks_on_sigusr1`): where a process that
seems stuck stands, without stopping it (`kill -USR1 PID`; the API's stacks go to its log).
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import signal
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """A stop signal arrived (SIGTERM, SIGHUP; SIGINT after serve's drain). A BaseException, like
    KeyboardInterrupt: `except Exception` handlers do not swallow it, clean-up handlers see it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention for "ended by signal N"


def _raise_stopped(signum, _frame) -> None:
    raise Stopped(signum)


def replace(signals, handler) -> dict:
    """Install `handler` for each of `signals` that is not ignored (SIG_IGN: e.g. SIGHUP under nohup,
    which must keep a build or a server running after the terminal closes); returns the previous
    handlers of those replaced, for `restore`."""
    previous = {}
    for sig in signals:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, handler)
    return previous


def restore(previous: dict) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise Stopped in the main thread while the block runs (SIGINT keeps
    raising KeyboardInterrupt). Main thread only; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = replace((signal.SIGTERM, signal.SIGHUP), _raise_stopped)
    try:
        yield
    finally:
        restore(previous)


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[list[int]]:
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends (a short, must-finish step, e.g. a swap into place).

    Yields a list that holds, afterwards, the signals that arrived meanwhile; the caller decides what
    they mean (after a finished swap: nothing to undo). The signals' handlers are replaced for the
    block rather than the signals masked: a process-directed signal goes to any thread that does not
    mask it (torch and tokenizers start threads), and only a handler always runs in the main thread.
    Main thread only; elsewhere a no-op.
    """
    arrived: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield arrived
        return
    previous = replace(STOP_SIGNALS, lambda signum, _frame: arrived.append(signum))
    try:
        yield arrived
    finally:
        restore(previous)


def dump_stacks_on_sigusr1() -> None:
    """SIGUSR1 writes every thread's Python stack to stderr and the process runs on (faulthandler).
    A stderr with no file descriptor (replaced, as pytest's capture does; closed: `2>&-`) leaves the
    signal as it was."""
    if not hasattr(signal, "SIGUSR1"):
        return
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    # RuntimeError: no sys.stderr at all; the others: one without a file descriptor
    except (AttributeError, ValueError, RuntimeError, io.UnsupportedOperation):
        return
