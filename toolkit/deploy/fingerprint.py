"""The fingerprint of what a repository serves: the same for a rebuild of the same thing elsewhere.

A manifest's build key hashes where the engine folder is (an absolute path), so a repository
rebuilt on the cluster's volume has another key than the one built and tested on a workstation.
The fingerprint leaves out only where things are and when they were made; it keeps everything
that decides what clients get: toolkit and model-source versions, target, checkpoint bytes,
limits, tokens, the engine's kind, release, ranks and runtime, the build settings, the
capabilities, the LoRA adapters' files and the memory plan.
"""

from __future__ import annotations

import hashlib
import json

from toolkit.repository.reader import Manifest

FINGERPRINT_CHARS = 16
_ENGINE_LOCATION = ("engine_dir",)


def fingerprint_fields(manifest: Manifest) -> dict:
    """The manifest's values that decide what is served, by name (what `fingerprint` hashes)."""
    return {
        "toolkit_version": manifest.toolkit_version,
        "sources_digest": manifest.sources_digest,
        "target": manifest.target,
        "model_source": manifest.model.source,
        "model_revision": manifest.model.revision,
        "checkpoint_files": manifest.checkpoint_files,
        "limits": manifest.limits.to_dict(),
        "tokens": manifest.tokens.to_dict(),
        "decoupled": manifest.decoupled,
        "engine": {
            **manifest.engine.to_dict(),
            "parameters": _without_location(manifest.engine.parameters),
        },
        "settings": _without_location(manifest.settings.to_dict()),
        "capabilities": manifest.capabilities.to_dict(),
        # LoRA adapters by name, task id and file hashes (a changed adapter is another deployment).
        **({"adapters": [a.to_dict() for a in manifest.adapters]} if manifest.adapters else {}),
        # Without its display name: how the model was written (hf:ORG/NAME or a catalog name, with or
        # without @REV) decides nothing that is served.
        "memory_plan": {
            k: v
            for k, v in (manifest.memory_plan.to_dict() if manifest.memory_plan else {}).items()
            if k != "model"
        },
    }


def _without_location(values: dict) -> dict:
    return {k: v for k, v in values.items() if k not in _ENGINE_LOCATION}


def fingerprint(manifest: Manifest) -> str:
    payload = json.dumps(fingerprint_fields(manifest), sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:FINGERPRINT_CHARS]


def describe(manifest: Manifest) -> str:
    """One line that tells two repositories apart for a person: target, model, revision, toolkit."""
    revision = manifest.model.revision
    model = manifest.model.source + (f"@{revision}" if revision else "")
    return (
        f"{manifest.target} repository of {model}, built by toolkit {manifest.toolkit_version} "
        f"(fingerprint {fingerprint(manifest)})"
    )
