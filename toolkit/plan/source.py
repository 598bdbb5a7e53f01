"""Model facts for planning: a config.json is enough, weights are never needed.

A catalog name (or a hub id the catalog knows, without a revision) is planned from the toolkit's
own copy of its config, so planning works offline; other hub ids fetch config.json only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from toolkit.errors import ModelSourceError
from toolkit.model.facts import ModelFacts, facts_from_config, read_model_facts
from toolkit.model.spec import ModelSpec, parse_model_spec


@dataclass(frozen=True)
class PlannedModel:
    name: str  # what plans and tables call the model
    spec: ModelSpec
    facts: ModelFacts
    config_from: str  # where the config came from: a path, "catalog (hub id ...)", "hub cache"
    # the local folder of a local model; None until a hub model is downloaded
    checkpoint_dir: Path | None

    @property
    def source(self) -> str:
        return self.spec.source


def load_model_for_plan(model: str | ModelSpec) -> PlannedModel:
    """Resolve --model to model facts without downloading weights."""
    spec = model if isinstance(model, ModelSpec) else parse_model_spec(model)
    if spec.kind == "local":
        return _local(spec)
    if spec.kind == "embedded":
        from toolkit.model.sources import resolve_model

        resolved = resolve_model(spec, progress=False)
        return PlannedModel(
            spec.display_name,
            spec,
            read_model_facts(resolved.path),
            str(resolved.path),
            resolved.path,
        )
    from toolkit.model.catalog import catalog_entry, entry_for_hub_id

    entry = (
        catalog_entry(spec.value)
        if spec.kind == "catalog"
        else (None if spec.revision else entry_for_hub_id(spec.value))
    )
    if entry is not None:
        facts = facts_from_config(
            entry.config, source=f"catalog {entry.name}", reasoning_parser=entry.reasoning_parser
        )
        return PlannedModel(
            entry.name, spec, facts, f"catalog (config.json of hf:{entry.hub_id})", None
        )
    from toolkit.model.sources import download_config

    config = download_config(spec.value, spec.revision)
    # A catalog model pinned to a revision keeps the catalog's name: the plan must not depend on how the
    # model was written (toolkit deploy's build Job rebuilds hf:ORG/NAME@REV of a build from hf:ORG/NAME).
    known = entry_for_hub_id(spec.value) if spec.kind == "hub" else None
    name = known.name if known is not None else spec.display_name
    facts = read_model_facts(config)
    if known is not None:  # only config.json is fetched: the catalog knows what its tokenizer says
        facts = replace(facts, reasoning_parser=known.reasoning_parser)
    return PlannedModel(name, spec, facts, str(config), None)


def _local(spec: ModelSpec) -> PlannedModel:
    path = Path(spec.value)
    if path.is_file():
        return PlannedModel(spec.display_name, spec, read_model_facts(path), str(path), path.parent)
    config = path / "config.json"
    if not config.is_file():
        raise ModelSourceError(
            f"no config.json in {path}",
            hint="point --model at a folder holding config.json, or at the file",
        )
    return PlannedModel(spec.display_name, spec, read_model_facts(config), str(config), path)
