"""Build targets behind one interface (toolkit.targets.base.Target): one module per target.

    get_target(name) -> Target           cpu, synthetic, or a GPU profile (h100-sxm, h200, ...)
    target_for(repository) -> Target     the target a built repository was made for
    engine_of(repository) -> EngineSpec  its `tensorrt_llm` variant, from the manifest

What differs between targets (planning, what goes into the repository, the engine's config,
preflight before serving, deploy resources, the capabilities record) lives in these modules; the
rest of the toolkit asks the target instead of branching on its name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolkit.errors import RecipeError
from toolkit.plan.gpus import GPU_PROFILES
from toolkit.targets.base import Resources, Target, TargetPlan
from toolkit.targets.cpu import CpuEngine, CpuTarget
from toolkit.targets.gpu import GpuTarget, TrtllmEngine
from toolkit.targets.synthetic import SyntheticEngine, SyntheticTarget

if TYPE_CHECKING:
    from toolkit.repository.engine import EngineSpec
    from toolkit.repository.reader import Repository

_PYTHON: dict[str, Target] = {t.name: t for t in (CpuTarget(), SyntheticTarget())}
_TARGETS: dict[str, Target] = {
    **_PYTHON,
    **{name: GpuTarget(profile) for name, profile in GPU_PROFILES.items()},
}
TARGET_NAMES: tuple[str, ...] = tuple(_TARGETS)
DEFAULT_TARGET = "cpu"

__all__ = [
    "DEFAULT_TARGET",
    "TARGET_NAMES",
    "CpuEngine",
    "Resources",
    "SyntheticEngine",
    "Target",
    "TargetPlan",
    "TrtllmEngine",
    "engine_of",
    "get_target",
    "gpu_target",
    "target_for",
]


def get_target(name: str) -> Target:
    """The target called `name`; RecipeError naming the known ones."""
    target = _TARGETS.get(str(name).strip().lower())
    if target is None:
        raise _not_one_of(f"unknown --target {name!r}", name, TARGET_NAMES)
    return target


def gpu_target(name: str) -> GpuTarget:
    """A GPU target by profile name (toolkit plan's --gpu); PlanError-like RecipeError otherwise."""
    target = get_target(name)
    if not isinstance(target, GpuTarget):
        raise _not_one_of(f"{name!r} is not a GPU profile", name, GPU_PROFILES)
    return target


def _not_one_of(message: str, name: str, known) -> RecipeError:
    """The refusal of a name that is none of `known` (they are the fix)."""
    return RecipeError(message, hint=f"use one of: {', '.join(known)}", value=name)


def target_for(repository: Repository) -> Target:
    return get_target(repository.target)


def engine_of(repository: Repository) -> EngineSpec:
    return target_for(repository).engine_from_section(repository.manifest.engine)
