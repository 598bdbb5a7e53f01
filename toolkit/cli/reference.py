"""The CLI reference (docs/cli.md), generated from the commands' own help so it cannot drift.

python -m toolkit.cli.reference > docs/cli.md      regenerate
tests/test_cli_reference.py                         fails when docs/cli.md differs from this output
"""

from __future__ import annotations

import sys
from typing import Any

import click

from toolkit.cli.main import CONTEXT_SETTINGS, cli

WIDTH = 100


def reference() -> str:
    parts = [
        "# CLI reference",
        "",
        "Generated from the commands' help by `python -m toolkit.cli.reference > docs/cli.md`;",
        "a test fails when this file and the help disagree. Every command also takes `-h`.",
        "",
    ]
    for name in [None, *sorted(n for n, c in cli.commands.items() if not c.hidden)]:
        parts += _section(name)
    return "\n".join(parts).rstrip() + "\n"


def _section(name: str | None) -> list[str]:
    command = cli if name is None else cli.commands[name]
    settings: dict[str, Any] = {
        **CONTEXT_SETTINGS,
        "terminal_width": WIDTH,
        "max_content_width": WIDTH,
    }
    parent = click.Context(cli, info_name="toolkit", **settings)
    context = (
        parent
        if name is None
        else click.Context(command, info_name=name, parent=parent, **settings)
    )
    title = "toolkit" if name is None else f"toolkit {name}"
    return [f"## `{title}`", "", "```text", command.get_help(context).rstrip(), "```", ""]


if __name__ == "__main__":
    sys.stdout.write(reference())
