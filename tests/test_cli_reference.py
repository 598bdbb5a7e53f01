"""docs/cli.md is the commands' own help; regenerate it with `python -m toolkit.cli.reference > docs/cli.md`."""

from __future__ import annotations

from pathlib import Path

from toolkit.cli.reference import reference

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def test_the_cli_reference_matches_the_commands_help():
    assert DOC.read_text() == reference(), (
        "docs/cli.md is stale: python -m toolkit.cli.reference > docs/cli.md"
    )


def test_the_reference_lists_every_command_and_its_options():
    text = reference()
    for command in ("api", "bench", "build", "generate", "plan", "serve"):
        assert f"## `toolkit {command}`" in text
    assert "--api-key-file" in text and "--no-decoupled" in text and "--max-queue-size" in text
