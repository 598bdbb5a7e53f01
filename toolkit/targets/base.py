"""The target interface: everything that differs between cpu, synthetic and the GPU profiles.

A target plans a build from its settings, builds (or describes) its `tensorrt_llm` engine, decides
the capabilities record, checks a repository before it is served, and sizes its deployment. No
module outside toolkit/targets/ branches on a target's name (tests/test_layers.py checks it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit.build_settings import (
    SETTINGS,
    BuildSettings,
    Setting,
    check_applies,
    check_values,
)
from toolkit.capabilities import GUIDE_KINDS, MAX_N, Capabilities
from toolkit.errors import RecipeError
from toolkit.repository.engine import EngineSection, EngineSpec
from toolkit.repository.limits import RepositoryLimits

if TYPE_CHECKING:
    from toolkit.engine.build_plan import EngineBuildPlan
    from toolkit.engine.info import EngineInfo
    from toolkit.model.adapters import CheckedAdapter
    from toolkit.model.sources import ResolvedModel
    from toolkit.model.spec import ModelSpec
    from toolkit.plan.memory import MemoryPlan
    from toolkit.repository.reader import Repository

Progress = Callable[[str], None]
GIB = 2**30
# Python, tokenizers, the API's and Triton's own memory.
HOST_OVERHEAD_BYTES = 2 * GIB
# The settings that are repository limits (toolkit.repository.limits.RepositoryLimits fields).
LIMIT_SETTINGS = (
    "max_batch_size",
    "max_input_len",
    "max_output_len",
    "max_seq_len",
    "max_num_tokens",
    "max_queue_size",
    "kv_cache_tokens",
    "kv_block_size",
)


@dataclass(frozen=True)
class TargetPlan:
    """What a target will build, before anything is downloaded or written."""

    settings: BuildSettings  # resolved: every setting that applies, with the value it will have
    limits: RepositoryLimits
    capabilities: Capabilities
    engine: EngineSpec | None  # cpu / synthetic; a GPU engine is known once compiled
    memory: MemoryPlan | None = None  # GPU targets
    engine_build: EngineBuildPlan | None = None  # GPU targets
    adapters: tuple[CheckedAdapter, ...] = ()  # LoRA adapters, checked against the base model

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "limits": self.limits.to_dict(),
            "settings": self.settings.to_dict(),
            "capabilities": self.capabilities.to_dict(),
        }
        if self.adapters:
            data["adapters"] = [checked.adapter.to_dict() for checked in self.adapters]
        if self.engine is not None:
            data["engine"] = self.engine.section().to_dict()
        if self.engine_build is not None and self.memory is not None:
            build = self.engine_build
            data.update(
                {
                    "plan": self.memory.to_dict(),
                    "engine_dir": build.engine_dir,
                    "steps": list(build.step_names),
                    "commands": [list(argv) for argv in build.commands],
                    "runtime": build.runtime.to_dict(),
                    "calibration": build.calibration.to_dict() if build.calibration else None,
                    "step_environment": {
                        name: dict(env)
                        for name, env in zip(build.step_names, build.step_environment, strict=False)
                        if env
                    },
                    "checkpoint_dir": build.checkpoint_dir,
                    "trtllm_version_pinned": build.trtllm_version_pinned,
                    "container": build.container,
                }
            )
        return data


@dataclass(frozen=True)
class Resources:
    """What one replica's triton container asks of a node, besides its GPUs."""

    memory_bytes: int
    cpus: int


class Target(ABC):
    """One build target: `cpu`, `synthetic`, or a GPU profile."""

    name: str
    kind: str  # the build settings' target kind: cpu | synthetic | gpu
    description: str
    # Seconds a replica needs besides hashing and loading its weights (container, imports, CUDA).
    start_seconds: int = 60

    # --- build ---------------------------------------------------------------------------------
    def check_settings(self, settings: BuildSettings, named: Callable[[Setting], str]) -> None:
        """Refuse settings that do not apply to this target or that contradict each other."""
        check_values(settings, f"--target {self.name}", named)
        check_applies(settings, self.kind, self.name, named)
        if (
            settings.max_input_len
            and settings.max_seq_len
            and settings.max_input_len >= settings.max_seq_len
        ):
            given = f"{named(SETTINGS['max_input_len'])} {settings.max_input_len}"
            raise RecipeError(
                f"{given} leaves no room to generate within {named(SETTINGS['max_seq_len'])} "
                f"{settings.max_seq_len}",
                hint="make max_input_len smaller than max_seq_len",
                value=settings.max_input_len,
            )

    @abstractmethod
    def plan(self, settings: BuildSettings, model: ModelSpec) -> TargetPlan:
        """Plan a build of `model` with these (checked) settings; nothing is downloaded or written."""

    def preflight_build(self, plan: TargetPlan) -> None:
        """Check this machine can run the planned build before anything is downloaded (the Python
        engines need nothing more)."""
        return None

    @abstractmethod
    def build_engine(
        self, plan: TargetPlan, model: ResolvedModel, progress: Progress
    ) -> tuple[EngineSpec, Any]:
        """The engine the repository packages, and what its build did (None when nothing ran)."""

    @abstractmethod
    def capabilities(self, settings: BuildSettings) -> Capabilities:
        """The request features a repository built with these resolved settings honours."""

    # --- the built repository ------------------------------------------------------------------
    def dry_run_details(self, plan: TargetPlan, output: Path) -> dict[str, Any]:
        """What a dry run shows besides the plan (GPU: the backend's parameters, the files written)."""
        return {}

    @abstractmethod
    def engine_from_section(self, section: EngineSection) -> EngineSpec:
        """The engine variant the manifest's engine section describes."""

    def check_sources(self, repository: Repository, current_digest: str) -> str | None:
        """Why a repository built from other model sources than this toolkit's cannot be served
        (None: it can). The Python engines run the repository's own copies, which must match."""
        return None

    def preflight(self, repository: Repository) -> int:
        """Check the engine can run on this machine before tritonserver starts; its world size."""
        return 1

    def check_server(self, repository: Repository, bundled_tritonserver: bool) -> None:
        """Refuse a tritonserver that cannot serve this repository's engine (`bundled_tritonserver`: the
        CPU-only one nvidia-pytriton bundles); any serves a Python one."""
        return None

    def compiled_engine(self, repository: Repository) -> EngineInfo | None:
        """The facts of the compiled engine the repository serves from outside it (None: the engine
        is inside the repository). Raises when its files are missing or incomplete."""
        return None

    # --- deploy --------------------------------------------------------------------------------
    def load_bytes(self, repository: Repository, engine_files: list[Path] | None) -> int:
        """Bytes a replica loads: the checkpoint the repository carries (GPU: every rank's engine file)."""
        from toolkit.repository import contract as c

        prefix = f"{c.ENGINE}/1/weights/"
        files = repository.manifest.files
        return sum(record.size for name, record in files.items() if name.startswith(prefix))

    @abstractmethod
    def slowest_stream_tokens_per_s(self, repository: Repository) -> float:
        """Tokens per second of the slowest stream a replica should expect (sizes the drain)."""

    def replica_tokens_per_s(self, repository: Repository, batch_slots: int) -> float | None:
        """Output tokens/s one replica streams with every batch slot busy (sizes the API's CPU); None
        when nothing bounds it (the API is then the bound)."""
        rate = self.slowest_stream_tokens_per_s(repository) * batch_slots
        return None if rate == float("inf") else rate

    def reuses_kv_cache(self, repository: Repository) -> bool:
        """Whether the engine reuses the KV blocks of prompt prefixes it computed before (what makes
        routing by prefix worth it). The Python engines share no prefixes."""
        return False

    @abstractmethod
    def resources(self, repository: Repository, load_bytes: int, world_size: int) -> Resources:
        """The triton container's memory (without /dev/shm) and CPUs."""

    def build_resources(self, checkpoint_bytes: int, world_size: int) -> Resources:
        """The build Job's memory (without /dev/shm) and CPUs: it holds the checkpoint and what it
        converts the checkpoint into (two copies)."""
        return Resources(HOST_OVERHEAD_BYTES + 2 * checkpoint_bytes, 2)

    def deploy_notes(self, repository: Repository, drain_s: int) -> list[str]:
        """What `toolkit deploy` should tell about the numbers it assumed for this target."""
        return []


def python_limits(settings: BuildSettings) -> RepositoryLimits:
    """The Python engines' limits: the given settings over the defaults."""
    return RepositoryLimits().overridden(
        **{name: getattr(settings, name) for name in LIMIT_SETTINGS}
    )


def plan_adapters(settings: BuildSettings, model: ModelSpec) -> tuple[CheckedAdapter, ...]:
    """The --lora adapters, each checked against the base model's config (no base weights needed)."""
    if not settings.lora:
        return ()
    from toolkit.model.adapters import BaseModel, base_model_names, check_adapters, parse_adapters
    from toolkit.plan.source import load_model_for_plan

    planned = load_model_for_plan(model)
    hub_id = None
    if model.kind == "catalog":
        from toolkit.model.catalog import catalog_entry

        hub_id = catalog_entry(model.value).hub_id
    served = model.source.split(":", 1)[-1].rstrip("/").rsplit("/", 1)[-1]
    base = BaseModel(planned.facts, base_model_names(model.value, planned.name, hub_id), served)
    return check_adapters(parse_adapters(settings.lora), base)


def adapter_setting(adapters: tuple[CheckedAdapter, ...]) -> tuple[tuple[str, str], ...] | None:
    """The resolved --lora pairs (local paths absolute, hub ids with their commit) for the manifest."""
    pairs = []
    for checked in adapters:
        source, revision = checked.adapter.source, checked.adapter.revision
        kind, _, where = source.partition(":")
        text = where if kind == "local" else f"hf:{where}" + (f"@{revision}" if revision else "")
        pairs.append((checked.name, text))
    return tuple(pairs) or None


def lora_capability(settings: BuildSettings) -> tuple[str, ...]:
    """The adapter names a repository built with these settings serves (capabilities.lora)."""
    return tuple(name for name, _ in settings.lora or ())


def model_engine_capabilities(name: str, settings: BuildSettings, **own: Any) -> Capabilities:
    """What every engine that runs the model (the CPU engine, TensorRT-LLM) honours alike: guided decoding of
    every kind, the sampled tokens' log probs, n > 1 and streaming when decoupled (one response per
    sequence), penalties and logit_bias, cached tokens, the --lora adapters; `own`: the target's other fields
    and its enable hints."""
    decoupled = bool(settings.decoupled)
    return Capabilities(
        target=name,
        guided_decoding=GUIDE_KINDS,
        logprobs=True,
        max_n=MAX_N if decoupled else 1,
        penalties=True,
        logit_bias=True,
        streaming=decoupled,
        cached_tokens=True,
        lora=lora_capability(settings),
        **own,
    )


LORA_HINT = (
    "rebuild the repository with --lora NAME=PATH (a PEFT adapter folder or hf:ORG/NAME[@REV])"
)
