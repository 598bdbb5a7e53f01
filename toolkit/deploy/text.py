"""What a string must be to reach the chart's templates: helm pastes values into YAML as text.

A value holding a line break writes YAML of its own: an --image of `REPO\\n  envFrom: [...]` put an
envFrom into every container, a newline in the repository path wrote keys through values.yaml's
header comment. So every string of the values toolkit deploy writes is checked here (no control
characters anywhere; an image is an image reference), the chart's templates quote every string they
render, and names are matched whole (`re.fullmatch`: `$` also matches before a trailing newline).
"""

from __future__ import annotations

import json
import re

from toolkit.errors import DeployError

# The distribution spec's reference grammar (distribution/reference/regexp.go): a host[:port] and
# lowercase path components, then a tag of at most 128 characters.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
IMAGE_REPOSITORY = re.compile(rf"(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*")
IMAGE_TAG = re.compile(r"[\w][\w.-]{0,127}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029\x85]")


def check_image_reference(repository: str, tag: str | None, given: str) -> None:
    """Refuse an image that is no REGISTRY/REPO[:TAG] reference (whitespace, a line break, ...)."""
    if IMAGE_REPOSITORY.fullmatch(repository) and (tag is None or IMAGE_TAG.fullmatch(tag)):
        return
    raise DeployError(
        f"--image {json.dumps(given)} is not an image reference: REGISTRY[:PORT]/REPO[:TAG], lowercase "
        "path components, no spaces or line breaks",
        hint="pass --image like registry.example.com/ml/toolkit or registry.example.com/ml/toolkit:1.0",
        value=given,
    )


def check_strings(values: dict, files: list[tuple[str, dict]]) -> None:
    """Refuse any string of the values with a control character (a line break above all), naming its
    key and the cluster file that set it."""
    for key, text in _strings(values, ""):
        if _CONTROL.search(text):
            source = next((path for path, data in files if _holds(data, key)), None)
            where = f" (set in {source})" if source else ""
            raise DeployError(
                f"`{key}`{where} is {json.dumps(text)[:80]}: it holds a line break or another control "
                "character, which would write YAML of its own into the chart's objects",
                hint=f"give `{key}` a value on one line, without control characters",
                value=text,
            )


def comment_line(text: str) -> str:
    """`text` for a YAML comment: one line whatever it holds (JSON-escaped when it is odd)."""
    return json.dumps(text)[1:-1] if _CONTROL.search(text) else text


def _strings(node, prefix: str):
    if isinstance(node, dict):
        for name, value in node.items():
            key = f"{prefix}.{name}" if prefix else str(name)
            if isinstance(name, str) and _CONTROL.search(name):
                yield key, name
            yield from _strings(value, key)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _strings(value, f"{prefix}[{index}]")
    elif isinstance(node, str):
        yield prefix, node


def _holds(data: dict, key: str) -> bool:
    head = re.split(r"[.\[]", key, maxsplit=1)[0]
    return isinstance(data, dict) and head in data
