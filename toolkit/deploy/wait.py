"""Wait until the repository a deployment was rendered for is on the volume; refuse any other.

    python -m toolkit.deploy.wait --repo DIR --fingerprint FP [--timeout SECONDS]

The chart runs it as each replica's init container (the build Job may still be running) and at the
end of the build Job (`--timeout 0`: the repository just built must be the one deployed). Exit 0
when DIR holds a complete, unmodified repository with fingerprint FP; exit 1, naming what is there
instead, when it holds another one, a modified one, or nothing after SECONDS.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from toolkit.deploy.fingerprint import describe, fingerprint
from toolkit.errors import DeployError, ToolkitError
from toolkit.repository.reader import MANIFEST, Repository, open_repository

POLL_S = 5.0
REPORT_EVERY_S = 60.0


def check_repository_for(repo: Path, expected: str) -> Repository | None:
    """The repository at `repo` when it is the expected one; None while there is none yet.

    DeployError when something else is there: a foreign or broken folder, a repository with
    another fingerprint, or one whose files changed after the build.
    """
    if not (repo / MANIFEST).is_file():
        return None  # toolkit build swaps a whole repository into place: no manifest, no repository yet
    try:
        repository = open_repository(repo)
    except ToolkitError as exc:
        raise DeployError(
            f"{repo} holds no usable repository: {exc.message}",
            hint="remove that folder from the volume; the build Job writes it again",
        ) from exc
    found = fingerprint(repository.manifest)
    if found != expected:
        raise DeployError(
            f"{repo} holds a {describe(repository.manifest)}, not the one deployed (fingerprint {expected})",
            hint="render the deployment for this repository (toolkit deploy --repo), or let the build "
            "Job of this release write its own repository",
        )
    changes = repository.file_changes()
    if changes:
        listed = ", ".join(f"{c.path} ({c.change})" for c in changes[:5])
        raise DeployError(
            f"{repo} differs from what toolkit build wrote: {listed}",
            hint="remove that folder from the volume and let the build Job write it again",
        )
    return repository


def wait_for_repository(
    repo: Path,
    expected: str,
    timeout_s: float,
    *,
    poll_s: float = POLL_S,
    on_wait: Callable[[str], None] = lambda _: None,
) -> Repository:
    """Poll until `repo` holds the expected repository (see check_repository_for); DeployError after `timeout_s`."""
    start = time.monotonic()
    reported = -REPORT_EVERY_S
    while True:
        repository = check_repository_for(repo, expected)
        if repository is not None:
            return repository
        waited = time.monotonic() - start
        if waited >= timeout_s:
            raise DeployError(
                f"no repository at {repo} after {timeout_s:.0f}s (fingerprint {expected} expected)",
                hint="see the build Job's log (kubectl logs job/<release>-build-...), or put the repository "
                "there yourself",
            )
        if waited - reported >= REPORT_EVERY_S:
            on_wait(f"waiting for the repository {repo} (fingerprint {expected}): {waited:.0f}s")
            reported = waited
        time.sleep(min(poll_s, max(0.0, timeout_s - waited)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m toolkit.deploy.wait", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--repo", required=True, type=Path, help="the repository folder on the volume"
    )
    parser.add_argument(
        "--fingerprint", required=True, help="the fingerprint toolkit deploy rendered"
    )
    parser.add_argument(
        "--timeout", type=float, default=0.0, help="seconds to wait for it (0: check once)"
    )
    args = parser.parse_args(argv)
    note = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    try:
        repository = wait_for_repository(args.repo, args.fingerprint, args.timeout, on_wait=note)
    except ToolkitError as exc:
        note(f"Error: {exc.message}")
        if exc.hint:
            note(f"  fix: {exc.hint}")
        return 1
    note(f"{args.repo}: {describe(repository.manifest)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
