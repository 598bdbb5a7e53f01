"""A Python-backend stub keeps its shared memory private, never outlives its tritonserver, and takes that
memory with it.

The stub's /dev/shm region carries every prompt and output of its model. The backend creates it
0644 (boost.interprocess sets the mode explicitly, whatever the umask), so each model makes its
region owner-only as it initializes, before the server takes requests.

The stub is a child of tritonserver. When tritonserver dies without unloading its models (kill -9,
its parent `toolkit serve` killed, its exit timeout running out), a stub busy generating is left
behind: it was seen parented to init, still generating minutes later, holding GBs and its
/dev/shm region (which carries prompts and outputs). So every model starts a watcher that polls
the stub's parent twice a second (/proc, no IPC): once it has changed, the server is gone, and the
watcher unlinks the shared-memory regions the stub maps (nobody else will) and kills the stub.

The watcher is a process of its own (a POSIX shell loop, a child of the stub), not a thread: a
stub's Python may never run again. One was seen left behind for minutes, its main thread in the
stub's exit holding the GIL, and a watcher thread waiting for the GIL for good. The shell ends with
its stub (a clean unload: the server removes the regions then).

(Not PR_SET_PDEATHSIG: it fires when the *thread* that forked the stub exits, and tritonserver
forks stubs from its model-loading threads; and SIGKILL on parent death would leave the region.)
"""

from __future__ import annotations

import os
import subprocess

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
    subprocess.Popen(
        [
            "/bin/sh",
            "-c",
            WATCHER,
            "die-with-server",
            str(os.getpid()),
            str(os.getppid()),
            str(POLL_S),
        ]
        + sorted(mapped_regions()),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,  # in tritonserver's session still: its stop ends the watcher too
    )


# $1 the stub, $2 its server, $3 the poll period, then the regions. Builtins only, but for sleep.
# - Stop signals are ignored (sleep inherits that): serve SIGTERMs tritonserver's group as it drains,
#   and a serve killed during that drain leaves the stubs to their watchers.
# - Its own parent first: once that is not the stub, the stub is gone (a clean unload), and its pid may
#   be another process's soon.
# - Then the stub's parent: once that is not the server, the server is gone.
WATCHER = r"""
trap '' TERM INT HUP
stub=$1 server=$2 period=$3
shift 3
parent_of() {
  parent=
  { while read -r key value _; do
      if [ "$key" = "PPid:" ]; then parent=$value; break; fi
    done < "/proc/$1/status"; } 2>/dev/null
}
while :; do
  parent_of $$
  [ "$parent" = "$stub" ] || exit 0
  parent_of "$stub"
  [ "$parent" = "$server" ] || break
  sleep "$period"
done
parent_of $$
[ "$parent" = "$stub" ] || exit 0  # it ended meanwhile: nothing of its to remove
rm -f -- "$@"
kill -9 "$stub"
"""


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
