"""Model facts for planning: a config.json is enough, weights are never needed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import ModelSourceError
from toolkit.model.facts import ModelFacts, read_model_facts
from toolkit.model.sources import EMBEDDED_DEFAULT, _HUB_ID


@dataclass(frozen=True)
class PlannedModel:
    name: str  # what plans and tables call the model
    config_path: Path  # the config.json the facts came from
    checkpoint_dir: Path  # where the checkpoint is (or will be, for a hub model)
    source: str
    facts: ModelFacts


def load_model_for_plan(spec: str) -> PlannedModel:
    """Resolve --model to its config.json: a bare file, a folder, hf:ORG/NAME (config only), or the embedded default."""
    spec = spec.strip()
    path = Path(spec).expanduser()
    if path.is_file():
        return _planned(path.stem if path.name != "config.json" else path.parent.name, path.resolve(), f"local:{path.resolve()}")
    if path.is_dir():
        config = path.resolve() / "config.json"
        if not config.is_file():
            raise ModelSourceError(f"no config.json in {path}", hint="point --model at a folder holding config.json, or at the file")
        return _planned(path.resolve().name, config, f"local:{path.resolve()}")
    if spec in (EMBEDDED_DEFAULT, f"embedded:{EMBEDDED_DEFAULT}"):
        from toolkit.model.sources import resolve_model

        resolved = resolve_model(spec, progress=False)
        return _planned(EMBEDDED_DEFAULT, resolved.path / "config.json", resolved.source)
    repo_id = spec[3:] if spec.startswith("hf:") else spec
    if _HUB_ID.match(repo_id.split("@", 1)[0]):
        return _planned(repo_id.split("@", 1)[0].split("/")[-1], _hub_config(repo_id), f"hf:{repo_id.split('@', 1)[0]}")
    raise ModelSourceError(
        f"unknown model source {spec!r}: not a config.json, not a folder, not a Hugging Face id",
        hint="use --model path/to/config.json, a checkpoint folder, or hf:ORG/NAME",
    )


def _planned(name: str, config: Path, source: str) -> PlannedModel:
    return PlannedModel(name=name, config_path=config, checkpoint_dir=config.parent, source=source, facts=read_model_facts(config))


def _hub_config(repo_id: str) -> Path:
    """Only config.json is downloaded; its snapshot folder is where the weights will land later."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    name, _, revision = repo_id.partition("@")
    try:
        return Path(hf_hub_download(name, "config.json", revision=revision or None))
    except LocalEntryNotFoundError as exc:
        raise ModelSourceError(
            f"config.json of hf:{name} is not in the local cache and cannot be downloaded",
            hint="check the network, or pass --model path/to/config.json",
        ) from exc
    except HfHubHTTPError as exc:
        raise ModelSourceError(f"cannot fetch config.json of hf:{name}: {exc}", hint="check the id; for a gated repo set HF_TOKEN") from exc
