"""`python -m toolkit.api`: the OpenAI API as a process of its own (what `toolkit serve --openai-port` starts).

It reads its settings as one JSON object on stdin, API keys included, so no secret is ever on a
command line (`ps`) or in an environment. Keys: the fields of toolkit.api.ApiSettings (repo as a
path, api_keys as a list, limits as an object of toolkit.settings.ApiLimits' fields, trace as one
of toolkit.trace.config.TracePlan's) plus host, port, log_level, loop, http, drain_timeout_s and
workers (with more than one, PROMETHEUS_MULTIPROC_DIR must be in the environment: toolkit.api.workers).
People start the API with `toolkit api`; this entry point is for the toolkit's own launchers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from toolkit.api.app import ApiSettings
from toolkit.api.server import run_api
from toolkit.errors import ToolkitError
from toolkit.settings import ApiLimits
from toolkit.signals import dump_stacks_on_sigusr1
from toolkit.trace.config import TracePlan

RUN_KEYS = ("host", "port", "log_level", "loop", "http", "drain_timeout_s", "workers")


def main() -> int:
    dump_stacks_on_sigusr1()
    try:
        data = json.loads(sys.stdin.read())
        run = {key: data.pop(key) for key in RUN_KEYS if key in data}
        settings = ApiSettings(
            **{
                **data,
                "repo": Path(data["repo"]),
                "api_keys": tuple(data.get("api_keys", ())),
                "limits": ApiLimits(**data.get("limits", {})),
                "trace": TracePlan(**data["trace"]) if data.get("trace") else None,
            }
        )
    except ToolkitError as exc:  # settings that parse but cannot serve (ApiLimits' own checks)
        return _print_error(exc)
    except (ValueError, KeyError, TypeError) as exc:
        print(
            f"Error: python -m toolkit.api needs its settings as JSON on stdin ({exc})",
            file=sys.stderr,
        )
        return 2
    try:
        run_api(settings, **run)
    except ToolkitError as exc:
        return _print_error(exc)
    return 0


def _print_error(exc: ToolkitError) -> int:
    """`Error: ...` and `  fix: ...` on stderr, as the CLI prints a ToolkitError; exit code 1."""
    print(f"Error: {exc.message}", file=sys.stderr)
    if exc.hint:
        print(f"  fix: {exc.hint}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
