"""argparse parsers built from tests/data/upstream/trtllm_tools.json: the upstream tools' flags as transcribed
from their own argparse definitions. The fake tools parse with these, never with the toolkit's own lists
(toolkit/engine/trtllm_flags.py), so a flag or value the real tool rejects fails here too."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RECORD = Path(__file__).resolve().parents[1] / "data" / "upstream" / "trtllm_tools.json"
_TYPES = {"int": int, "float": float, "str": str}


def upstream_flags(tool: str) -> dict:
    return json.loads(RECORD.read_text())[tool]["flags"]


def upstream_parser(tool: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=tool, allow_abbrev=False)
    for name, flag in upstream_flags(tool).items():
        names = [f"--{name}", *flag.get("aliases", [])]
        kwargs: dict = {}
        if flag.get("action") == "store_true":
            parser.add_argument(*names, action="store_true")
            continue
        # a pybind enum built from the string, any letter case
        if flag.get("type") == "KVCacheType":
            choices = flag["choices"]
            kwargs["type"] = lambda value, choices=choices: _case_insensitive(value, choices)
        else:
            kwargs["type"] = _TYPES.get(flag.get("type"), str)
            if flag.get("choices"):
                kwargs["choices"] = flag["choices"]
        if flag.get("required"):
            kwargs["required"] = True
        if flag.get("nargs"):
            kwargs["nargs"] = flag["nargs"]
            if flag["nargs"] == "?":
                kwargs["const"] = flag.get("const")
        parser.add_argument(*names, **kwargs)
    return parser


def _case_insensitive(value: str, choices: list[str]) -> str:
    if value.lower() not in choices:
        raise argparse.ArgumentTypeError(
            f"invalid choice: {value!r} (choose from {', '.join(choices)})"
        )
    return value.lower()
