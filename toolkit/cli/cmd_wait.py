"""`toolkit wait-for-repository` (hidden): what the chart's init container and build Job run."""

from __future__ import annotations

import click

from toolkit.cli.options import repo_option, timeout_option
from toolkit.deploy.fingerprint import describe
from toolkit.deploy.wait import wait_for_repository


@click.command("wait-for-repository", hidden=True)
@repo_option("The repository folder on the volume.", required=True)
@click.option("--fingerprint", required=True, help="The fingerprint toolkit deploy rendered.")
@timeout_option("Seconds to wait for it (0: check once).", default=0.0, minimum=0)
def command(repo, fingerprint, timeout):
    """Wait until REPO holds the repository with FINGERPRINT that toolkit deploy rendered, built by
    this toolkit and unmodified; refuse any other (exit 1, naming what is there)."""

    # Plain lines (no rich wrapping): they end up in `kubectl logs`, one event per line.
    def say(message: str) -> None:
        click.echo(message, err=True)

    repository = wait_for_repository(repo, fingerprint, timeout, on_wait=say)
    say(f"{repo}: {describe(repository.manifest)}")
