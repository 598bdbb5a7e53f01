"""Stopping what we started: every tool and server runs in its own session (process group)."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_process(process: subprocess.Popen, timeout_s: float = 20.0) -> int | None:
    """terminate -> wait -> kill, for the whole process group the child leads (start_new_session=True)."""
    if process.poll() is None:
        _signal_group(process, signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait(10)
    return process.returncode


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
