"""`toolkit` entry point. Each `cmd_*.py` module beside this one contributes one command."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import click

from toolkit import __version__
from toolkit.errors import ToolkitError
from toolkit.signals import Stopped, stop_signals_raise

# No auto_envvar_prefix: an option reads the environment only where toolkit.cli.options declares it
# (and --help shows it).
CONTEXT_SETTINGS = {
    "help_option_names": ["-h", "--help"],
    "show_default": True,
}


class ToolkitGroup(click.Group):
    """Maps ToolkitError to `Error: ...` on stderr and exit code 1; anything else propagates."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ToolkitError as exc:
            click.echo(f"Error: {exc.message}", err=True)
            if exc.hint:
                click.echo(f"  fix: {exc.hint}", err=True)
            ctx.exit(1)


@click.group(cls=ToolkitGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "-V", "--version")
def cli() -> None:
    """Build, serve and measure LLM deployments on Triton Inference Server."""


def _register_commands() -> None:
    import toolkit.cli as package

    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name.startswith("cmd_"):
            module = importlib.import_module(f"toolkit.cli.{info.name}")
            cli.add_command(module.command)


_register_commands()


def main() -> None:
    """SIGTERM and SIGHUP stop a command as Ctrl-C does (its clean-up runs: no child process or staging
    folder is left behind), and the exit code says which signal it was (128 + N)."""
    with stop_signals_raise():
        try:
            cli(prog_name="toolkit")
        except Stopped as stop:
            click.echo(f"stopped by {stop}", err=True)
            sys.exit(stop.exit_code)


if __name__ == "__main__":
    main()
