"""What the CPU and synthetic targets share: a Python-backend `tensorrt_llm` with the engine's contract."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from tritonclient.grpc import model_config_pb2 as mc

from toolkit.build_settings import CPU_PRECISION, SETTINGS, BuildSettings, Setting
from toolkit.capabilities import Capabilities
from toolkit.errors import RecipeError, RepositoryError
from toolkit.fsutil import copy_file
from toolkit.model.adapters import ADAPTER_FILES, CheckedAdapter
from toolkit.model.tokens import TokenFacts
from toolkit.repository import configs
from toolkit.repository import contract as c
from toolkit.repository.engine import CANCELLATION_CHECK_PERIOD_MS, EngineSection
from toolkit.repository.sources import COMMON_MODULES, model_repo_sources
from toolkit.targets.base import (
    LIMIT_SETTINGS,
    Progress,
    Target,
    TargetPlan,
    adapter_setting,
    plan_adapters,
    python_limits,
)

if TYPE_CHECKING:
    from toolkit.repository.writer import RepositoryPlan

# The adapters' folder inside the engine's version folder: not the repository root, where Triton would
# take each folder for a model.
LORA_DIR = "lora"


def engine_refusals(capabilities: Capabilities) -> dict[str, list[Any]]:
    """{engine input: [the value that means "off" (None: any value), the refusal]} for every input
    whose feature the repository does not honour (toolkit.repository.contract.ENGINE_INPUT_FEATURES)."""
    return {
        name: [off, capabilities.refusal(feature, f"input {name}")]
        for name, (feature, off) in c.ENGINE_INPUT_FEATURES.items()
        if not capabilities.supports(feature)
    }


@dataclass(frozen=True)
class PythonEngine:
    """A Python-backend model with the engine's tensor contract; its fields are its own settings."""

    kind: ClassVar[str]
    source_folder: ClassVar[str]
    copies_weights: ClassVar[bool] = False

    @property
    def trtllm_version(self) -> str | None:
        """The TensorRT-LLM release whose tensor names the engine reads: the pinned one."""
        return None

    @property
    def lora_weights_type(self) -> str | None:
        """The stock type: the Python engines refuse lora_weights, whatever its type."""
        return None

    def section(self) -> EngineSection:
        parameters = {f.name: getattr(self, f.name) for f in fields(self)}
        return EngineSection(kind=self.kind, parameters=_jsonable(parameters))

    def prepared(self, checkpoint: Path, tokens: TokenFacts) -> PythonEngine:
        return self

    def install_adapters(self, version: Path, adapters: tuple[CheckedAdapter, ...]) -> None:
        """The PEFT files as given, in lora/<task id>/ of the version folder (the `lora_dir` parameter)."""
        for checked in adapters:
            folder = version / LORA_DIR / str(checked.adapter.task_id)
            for name in ADAPTER_FILES:
                copy_file((checked.folder / name).resolve(), folder / name)

    def install(self, version: Path, checkpoint: Path) -> None:
        sources = model_repo_sources()
        shutil.copytree(
            sources / self.source_folder / "1",
            version,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        for name in COMMON_MODULES:
            shutil.copy2(sources / "common" / f"{name}.py", version / f"{name}.py")

    def config(self, plan: RepositoryPlan) -> mc.ModelConfig:
        limits, tokens = plan.limits, plan.tokens
        parameters = {
            "max_seq_len": limits.max_seq_len,
            "max_output_len": limits.max_output_len,
            "max_num_tokens": limits.max_num_tokens,
            "max_queue_size": limits.max_queue_size,
            "end_id": tokens.end_id,
            "stop_ids": ",".join(str(i) for i in tokens.stop_ids),  # the model's other end tokens
            "pad_id": tokens.pad_id,
            "exclude_input_in_output": True,
            "vocab_size": plan.facts.vocab_size,
            "kv_block_size": limits.kv_block_size,
            "kv_cache_blocks": limits.kv_cache_blocks,
            "cancellation_check_period_ms": CANCELLATION_CHECK_PERIOD_MS,
            "decoupled": plan.decoupled,
            "refusals": json.dumps(engine_refusals(plan.capabilities), sort_keys=True),
            **lora_parameters(plan.adapters),
            **self.engine_parameters(),
        }
        return configs.python_model(
            c.ENGINE,
            c.PYTHON_ENGINE_INPUTS,
            c.PYTHON_ENGINE_OUTPUTS,
            max_batch_size=limits.max_batch_size,
            decoupled=plan.decoupled,
            parameters=parameters,
        )

    def engine_parameters(self) -> dict[str, Any]:
        return {}

    @classmethod
    def fields_from(cls, parameters: dict) -> dict:
        """The engine's fields from the manifest's JSON parameters (lists back to tuples, ...)."""
        return parameters

    @classmethod
    def from_section(cls, section: EngineSection) -> PythonEngine:
        try:
            return cls(**cls.fields_from(section.parameters))
        except TypeError as exc:
            raise RepositoryError(
                f"the manifest's engine section does not fit a {cls.kind} engine: {exc}",
                hint="rebuild the repository",
            ) from exc


def lora_parameters(adapters: tuple[CheckedAdapter, ...]) -> dict[str, Any]:
    """The engine's LoRA parameters: where the adapters are (relative to the version folder), task id ->
    name, and the largest rank (0: none)."""
    records = [checked.adapter for checked in adapters]
    return {
        "lora_dir": LORA_DIR,
        "lora_adapters": json.dumps({str(a.task_id): a.name for a in records}, sort_keys=True),
        "lora_max_rank": max((a.rank for a in records), default=0),
    }


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


class PythonTarget(Target):
    """cpu and synthetic: a Python engine, its limits from the settings over the defaults."""

    engine_class: ClassVar[type[PythonEngine]]
    # The engine's own settings (beyond the limits), by BuildSettings name -> engine field.
    engine_settings: ClassVar[tuple[str, ...]] = ()

    def check_settings(self, settings: BuildSettings, named) -> None:
        super().check_settings(settings, named)
        for name in ("dtype", "kv_dtype"):
            value = getattr(settings, name)
            if value is not None and value != CPU_PRECISION:
                row: Setting = SETTINGS[name]
                raise RecipeError(
                    f"{named(row)} {value}: the {self.name} target runs {CPU_PRECISION} weights and KV "
                    "cache",
                    hint=f"drop {named(row)} (or give {CPU_PRECISION}), or build for a GPU target "
                    "(--target h100-sxm)",
                    value=value,
                )

    def plan(self, settings: BuildSettings, model) -> TargetPlan:
        adapters = plan_adapters(settings, model)  # checked before anything is written
        limits = python_limits(settings)
        given = {name: getattr(settings, name) for name in self.engine_settings}
        engine = self.engine_class(**{k: v for k, v in given.items() if v is not None})
        resolved = BuildSettings(
            dtype=CPU_PRECISION,
            kv_dtype=CPU_PRECISION,
            decoupled=True if settings.decoupled is None else settings.decoupled,
            **{name: getattr(limits, name) for name in LIMIT_SETTINGS},
            **{
                name: getattr(engine, name)
                for name in self.engine_settings
                if getattr(engine, name) != ""  # a text setting left unset
            },
            lora=adapter_setting(adapters),
        )
        return TargetPlan(resolved, limits, self.capabilities(resolved), engine, adapters=adapters)

    def build_engine(self, plan: TargetPlan, model, progress: Progress):
        if plan.engine is None:
            raise TypeError(f"a {self.name} plan names its engine")  # a plan of another target
        return plan.engine, None

    def engine_from_section(self, section: EngineSection) -> PythonEngine:
        return self.engine_class.from_section(section)

    def check_sources(self, repository, current_digest: str) -> str | None:
        if repository.manifest.sources_digest == current_digest:
            return None
        return (
            f"was built by toolkit {repository.manifest.toolkit_version} from other model sources than "
            "this toolkit's"
        )
