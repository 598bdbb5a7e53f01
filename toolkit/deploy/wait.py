"""Wait until the repository a deployment was rendered for is on the volume; refuse any other.

    wait_for_repository(repo, fingerprint, timeout_s) -> Repository

The chart runs it (`toolkit wait-for-repository`, a hidden command) as each replica's init
container (the build Job, a helm hook, has finished by then; with build.enabled=false it waits for
the repository you put there), and as the build Job's container after its build (`--timeout 0`:
the repository just built must be the one deployed). It succeeds when the folder holds a complete,
unmodified repository with the rendered fingerprint, built by this toolkit; it fails, naming what is
there instead, when it holds another one, a modified one, or nothing after the timeout. Hashing the
files leaves memos in TOOLKIT_HOME, which the pod's containers share, so `toolkit serve` does not
hash them again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from toolkit.deploy.fingerprint import describe, fingerprint
from toolkit.errors import DeployError, ToolkitError
from toolkit.repository.reader import MANIFEST, Repository, open_repository
from toolkit.serve.launcher import check_repository

POLL_S = 5.0
REPORT_EVERY_S = 60.0
REBUILD_ON_THE_VOLUME = (
    "remove that folder from the volume, then run the build Job again: helm upgrade ... "
    "--set build.rerun=$(date +%s)"
)


def check_repository_for(repo: Path, expected: str) -> Repository | None:
    """The repository at `repo` when it is the expected one; None while there is none yet.

    DeployError when something else is there: a foreign or broken folder, or a repository with
    another fingerprint; RepositoryError (toolkit.serve.launcher.check_repository) when its files
    changed after the build or another toolkit built it.
    """
    if not (repo / MANIFEST).is_file():
        return None  # toolkit build swaps a whole repository into place: no manifest, no repository yet
    try:
        repository = open_repository(repo)
    except ToolkitError as exc:
        raise DeployError(
            f"{repo} holds no usable repository: {exc.message}",
            hint=REBUILD_ON_THE_VOLUME,
        ) from exc
    found = fingerprint(repository.manifest)
    if found != expected:
        raise DeployError(
            f"{repo} holds a {describe(repository.manifest)}, not the one deployed (fingerprint {expected})",
            hint="render the deployment for this repository (toolkit deploy --repo), or let the build "
            "Job of this release write its own repository",
        )
    return check_repository(repo, same_toolkit=True, modified_fix=REBUILD_ON_THE_VOLUME)


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
