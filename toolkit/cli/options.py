"""Options several commands share, declared once."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.settings import API_KEYS


def api_key_options(function):
    """-k/--api-key-file (repeatable) and a hidden --api-key that refuses a key on the command line."""
    function = click.option("--api-key", "api_key", default=None, hidden=True, expose_value=True)(
        function
    )
    return click.option(
        "-k",
        "--api-key-file",
        "api_key_files",
        multiple=True,
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help=f"OpenAI API: a file of bearer keys, one per line (repeatable); also {API_KEYS} (comma-separated). "
        "None: no auth.",
    )(function)


def reject_api_key_value(value: str | None) -> None:
    if value is not None:
        raise click.UsageError(
            "--api-key takes no key on the command line (every user of this machine can read it in `ps`); "
            f"put the key in a file and pass -k/--api-key-file FILE, or set {API_KEYS}"
        )
