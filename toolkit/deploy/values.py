"""Values files: the chart's own defaults, cluster files; read them, merge them the way helm does,
and refuse cluster values that contradict the repository (its facts come from the manifest, never
from a cluster file)."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import yaml

from toolkit.errors import DeployError
from toolkit.plan.gpus import GPU_PROFILES

# Keys whose values are facts of the repository (or of --no-build): toolkit deploy writes them, a
# cluster file may not.
MANIFEST_KEYS = ("model", "build.enabled", "build.args")


def chart_source() -> Path:
    """deploy/ of a source checkout, or the copy a wheel carries as toolkit/_deploy."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "_deploy", package.parent / "deploy"):
        if (candidate / "Chart.yaml").is_file():
            return candidate
    raise DeployError(
        "the toolkit's Helm chart (deploy/Chart.yaml) is not installed with this toolkit",
        hint="reinstall the toolkit (pip install -e . in a checkout)",
    )


@functools.cache
def _chart_defaults() -> dict:
    return load_values_file(chart_source() / "values.yaml")


def chart_defaults() -> dict:
    """The chart's values.yaml: the defaults helm merges under every values file (a fresh copy)."""
    return copy.deepcopy(_chart_defaults())


def load_values_file(path: Path) -> dict:
    """A YAML mapping of chart values; DeployError naming the file when it is not one."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise DeployError(
            f"cannot read the values file {path}: {exc.strerror}",
            hint="pass a readable YAML file to -f",
        ) from exc
    except yaml.YAMLError as exc:
        raise DeployError(
            f"{path} is not valid YAML: {exc}", hint="fix the file, or drop -f"
        ) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise DeployError(
            f"{path} holds a {type(data).__name__}, not a mapping of chart values",
            hint="write chart values as YAML keys (see deploy/values.yaml)",
        )
    return data


def merge(base: dict, override: dict) -> dict:
    """`override` over `base`, maps merged key by key and everything else replaced (helm's -f order)."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


@functools.cache
def _chart_schema() -> dict:
    return json.loads((chart_source() / "values.schema.json").read_text(encoding="utf-8"))


def schema_problems(values: dict) -> list[tuple[str, str]]:
    """(dotted key, message) for what the chart's values.schema.json refuses in `values` (merged over
    the chart's defaults, as helm validates them), in a stable order: helm would refuse the install."""
    import jsonschema  # the draft helm validates values.schema.json with

    validator = jsonschema.Draft7Validator(_chart_schema())
    problems = []
    for error in sorted(
        validator.iter_errors(values), key=lambda e: list(map(str, e.absolute_path))
    ):
        key = ".".join(str(part) for part in error.absolute_path)
        if error.validator == "additionalProperties":
            known = set(error.schema.get("properties", {}))
            extra = sorted(set(error.instance) - known)
            key = ".".join(filter(None, (key, extra[0] if extra else "")))
        problems.append((key, error.message))
    return problems


def lookup(values: dict, dotted: str, default=None):
    node = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def check_cluster_values(cluster: dict, target: str, gpu: bool, where: str) -> None:
    """Refuse cluster values that would run this repository somewhere it cannot run."""
    for key in MANIFEST_KEYS:
        if lookup(cluster, key) is not None:
            raise DeployError(
                f"{where} sets `{key}`, which toolkit deploy takes from the repository's manifest",
                hint=f"remove `{key}` from {where}; deploy another repository with --repo (or pass "
                "--no-build) instead",
            )
    if gpu:
        return
    count = lookup(cluster, "gpu.count", 0) or 0
    products = lookup(cluster, "gpu.products") or []
    if count or products:
        setting = f"gpu.count={count}" if count else f"gpu.products={products}"
        raise DeployError(
            f"{where} asks for GPUs ({setting}), but the repository is a {target} repository, which runs "
            "on CPU and would hold the GPUs idle",
            hint="drop the gpu settings for this deployment, or build the repository for a GPU target "
            "(toolkit build --target h100-sxm ...)",
        )


def gpu_products_for(target: str, cluster: dict, where: str) -> list[str]:
    """The node label values of the repository's GPU: from the cluster values' `gpu.targets` when
    they name targets, else from GPU Feature Discovery's names in the GPU's profile."""
    named = lookup(cluster, "gpu.targets")
    if named is not None:
        if not isinstance(named, dict) or target not in named or not named[target]:
            listed = ", ".join(sorted(named)) if isinstance(named, dict) and named else "none"
            raise DeployError(
                f"the engines were built for {target}, and the cluster values ({where}) name only these "
                f"GPU targets: {listed}",
                hint=f"deploy where {target} GPUs are (or add `gpu.targets.{target}` with their "
                f"node label values to {where}), or rebuild for one of: {listed}",
            )
        return [str(p) for p in named[target]]
    profile = GPU_PROFILES.get(target)
    if profile is None or not profile.gpu_products:
        raise DeployError(
            f"toolkit deploy knows no node label for the GPU target {target}",
            hint=f"name it in a cluster values file: gpu.targets.{target}: [<nvidia.com/gpu.product value>]",
        )
    return list(profile.gpu_products)
