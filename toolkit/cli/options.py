"""Options several commands share, declared once."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.build_settings import SETTINGS, BuildSettings, Setting, rows
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


# --- build settings: options derived from toolkit.build_settings, one declaration each ------------
class SettingType(click.ParamType):
    """A build setting's value, parsed and checked by its declaration (the rule recipes use too)."""

    def __init__(self, row: Setting):
        self.row = row
        self.name = row.kind.__name__

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return self.row.parse_text(value)
        except ValueError as exc:
            self.fail(f"{exc} (fix: pass {self.row.flag} as {self.row.expected()})", param, ctx)

    def get_metavar(self, param, ctx=None) -> str:
        if self.row.choices:
            return "[" + "|".join(str(choice) for choice in self.row.choices) + "]"
        return {int: "INTEGER", float: "FLOAT", str: "TEXT", Path: "PATH"}[self.row.kind]


def setting_options(*names: str):
    """click options for these build settings (all of them when none is named), in the table's order."""

    def decorate(function):
        for row in reversed(list(rows(names or None))):
            text = f"{row.help} [default: {row.default}]"
            if row.kind is bool:
                decls = [f"--{row.option}/--{row.negation}", row.name]
                function = click.option(*decls, default=None, help=text)(function)
            else:
                decls = [*([row.short] if row.short else []), f"--{row.option}", row.name]
                function = click.option(
                    *decls, type=SettingType(row), default=None, show_default=False, help=text
                )(function)
        return function

    return decorate


def pop_settings(values: dict) -> BuildSettings:
    """The BuildSettings among a command's keyword arguments (removed from `values`)."""
    return BuildSettings(**{name: values.pop(name) for name in SETTINGS if name in values})


def json_option(function):
    return click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")(
        function
    )
