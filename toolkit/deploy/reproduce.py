"""The `toolkit build` arguments that make the same repository again, for the cluster's build Job.

Everything comes from the manifest: its model and target, and the build settings as the build
resolved them (toolkit.build_settings). The Job then checks the result's fingerprint, so an
argument this misses fails the Job loudly instead of serving something else.
"""

from __future__ import annotations

from toolkit.errors import DeployError
from toolkit.repository.reader import Repository

NO_BUILD_HINT = (
    "pass --no-build and put the repository on the volume yourself (build it where the volume is "
    "mounted at --mount-path, e.g. in a pod), or build from hf:ORG/NAME@REV or a catalog name so the "
    "Job can download the checkpoint"
)


def build_arguments(repository: Repository) -> list[str]:
    """`toolkit build` arguments (without --output / --engine-dir) that rebuild `repository`: its model
    at a pinned revision, its target, and every build setting as the manifest recorded it."""
    manifest = repository.manifest
    args = ["--model", model_argument(repository), "--target", manifest.target]
    check_adapters_reachable(repository)
    return args + manifest.settings.rebuild_arguments()


def check_adapters_reachable(repository: Repository) -> None:
    """The Job downloads hub adapters at their recorded commit (the rebuild arguments name it); a local
    adapter folder is not on the cluster."""
    local = [a for a in repository.adapters if not a.source.startswith("hf:")]
    if local:
        listed = ", ".join(f"{a.name} ({a.source})" for a in local)
        raise DeployError(
            f"{repository.path} serves LoRA adapters from local folders, which the cluster's build Job "
            f"cannot reach: {listed}",
            hint="push them to the hub and rebuild with --lora NAME=hf:ORG/NAME@REV, or "
            + NO_BUILD_HINT,
        )


def model_argument(repository: Repository) -> str:
    """The --model value that downloads the same checkpoint: a pinned hub revision or the embedded model."""
    source = repository.model_source
    kind, _, value = source.partition(":")
    revision = repository.manifest.model.revision
    if kind == "embedded":
        return value
    if kind == "hf":
        if not revision:
            raise DeployError(
                f"{repository.path} was built from {source} without a pinned revision; the build Job "
                "could download another one",
                hint=f"rebuild with --model hf:{value}@<commit>, or {NO_BUILD_HINT}",
            )
        return f"hf:{value}@{revision}"
    raise DeployError(
        f"{repository.path} was built from {source}, which the cluster's build Job cannot reach",
        hint=NO_BUILD_HINT,
    )
