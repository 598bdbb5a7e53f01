"""A Python-backend stub keeps its shared memory private, never outlives its tritonserver, and takes that
memory with it.

The stub's /dev/shm region carries every prompt and output of its model. The backend creates it
0644 (boost.interprocess sets the mode explicitly, whatever the umask), so each model makes its
region owner-only as it initializes, before the server takes requests.

The stub is a child of tritonserver. When tritonserver dies without unloading its models (kill -9,
its parent `toolkit serve` killed, its exit timeout running out), a stub busy generating is left
behind: it was seen parented to init, still generating minutes later, holding GBs and its
/dev/shm region (which carries prompts and outputs). So every model starts a watcher that polls
its parent (a getppid() syscall twice a second, no IPC): once the parent has changed, the server
is gone, and the stub unlinks the shared-memory regions it maps (nobody else will) and kills itself.

(Not PR_SET_PDEATHSIG: it fires when the *thread* that forked the stub exits, and tritonserver
forks stubs from its model-loading threads; and SIGKILL on parent death would leave the region.)
"""

from __future__ import annotations

import os
import signal
import threading
import time

POLL_S = 0.5
# Region names: toolkit serve's prefix (toolkit/serve/launcher.py shm_prefix), or the backend's default.
REGION_PREFIXES = ("toolkit_", "triton_python_backend_shm_region_")


def bind_to_server() -> None:
    """Make this stub's regions owner-only and start the watcher (call first thing in initialize, while
    tritonserver is alive: it is the one calling)."""
    for path in mapped_regions():
        try:
            os.chmod(path, 0o600)
        except OSError:
            pass  # not ours to change (another user's server): nothing we can do from here
    parent = os.getppid()
    threading.Thread(target=_watch, args=(parent,), name="die-with-server", daemon=True).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    for path in mapped_regions():
        try:
            os.unlink(path)
        except OSError:
            pass  # already gone (the server's own clean-up got there first)
    os.kill(os.getpid(), signal.SIGKILL)


def mapped_regions() -> set[str]:
    """The backend's /dev/shm regions this process maps, from /proc/self/maps."""
    found = set()
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.rstrip("\n").split(maxsplit=5)
                path = fields[5] if len(fields) == 6 else ""
                name = path.removeprefix("/dev/shm/").removesuffix(" (deleted)")
                if path.startswith("/dev/shm/") and name.startswith(REGION_PREFIXES):
                    found.add("/dev/shm/" + name)
    except OSError:
        pass
    return found
