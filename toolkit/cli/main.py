"""`toolkit` entry point. Each `cmd_*.py` module beside this one contributes one command."""

from __future__ import annotations

import errno
import importlib
import pkgutil
import sys

import click

from toolkit import __version__
from toolkit.errors import ToolkitError
from toolkit.signals import Stopped, dump_stacks_on_sigusr1, stop_signals_raise

# No auto_envvar_prefix: an option reads the environment only where toolkit.cli.options declares it
# (and --help shows it).
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
CONTEXT_SETTINGS = {
    "help_option_names": ["-h", "--help"],
    "show_default": True,
}


class UsageProblem(click.ClickException):
    """click's own parsing errors (an unknown option, a bad value, a missing argument) said as every other
    error is: `Error: ...`, `  fix: ...`, exit code 1 (click's default is its usage text and exit 2)."""

    exit_code = 1

    def __init__(self, error: click.UsageError):
        super().__init__(error.format_message())
        path = error.ctx.command_path if error.ctx is not None else "toolkit"
        param = getattr(error, "param", None)  # BadParameter and its kin name the option
        where = param.get_error_hint(error.ctx) if param is not None and error.ctx else None
        self.fix = (
            f"give {where} a valid value; `{path} -h` lists the options and their values"
            if where
            else f"`{path} -h` lists the commands, options and arguments"
        )

    def show(self, file=None) -> None:
        click.echo(f"Error: {self.message}", err=True)
        click.echo(f"  fix: {self.fix}", err=True)


class ToolkitGroup(click.Group):
    """Maps ToolkitError (and click's usage errors, and a full disk) to `Error: ...` and a `fix:` line on
    stderr, exit code 1; anything else propagates."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:  # the group's own options (`toolkit --bogus`)
            if isinstance(exc, click.exceptions.NoArgsIsHelpError):
                raise
            raise UsageProblem(exc) from exc

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ToolkitError as exc:
            _error(exc.message, exc.hint)
            ctx.exit(1)
        except click.UsageError as exc:  # a command's options and arguments, an unknown command
            raise UsageProblem(exc) from exc
        except OSError as exc:
            if exc.errno not in DISK_FULL:
                raise
            _error(
                f"the filesystem is full: {exc.strerror} ({exc.filename or 'while writing'})",
                "free some space there; the toolkit's caches live in TOOLKIT_HOME "
                "(default ~/.cache/toolkit), which you can point at a filesystem with room",
            )
            ctx.exit(1)


def _error(message: str, hint: str | None) -> None:
    click.echo(f"Error: {message}", err=True)
    if hint:
        click.echo(f"  fix: {hint}", err=True)


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
    dump_stacks_on_sigusr1()
    with stop_signals_raise():
        try:
            cli(prog_name="toolkit")
        except Stopped as stop:
            click.echo(f"stopped by {stop}", err=True)
            sys.exit(stop.exit_code)


if __name__ == "__main__":
    main()
