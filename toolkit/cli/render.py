"""Shared rendering: JSON on stdout for machines, rich tables for people, notes on stderr."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table

stderr_console = Console(stderr=True)
stdout_console = Console()


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def emit_table(title: str, rows: list[tuple[str, Any]]) -> None:
    table = Table(title=title, show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    for key, value in rows:
        table.add_row(key, str(value))
    stdout_console.print(table)


def note(message: str) -> None:
    stderr_console.print(message, highlight=False)
