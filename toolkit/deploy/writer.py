"""Write a deployment: the chart's values for one repository, a copy of the chart, the image recipes.

    OUT/values.yaml     every value toolkit deploy decided (helm merges the chart's defaults under it)
    OUT/chart/          the chart (deploy/ of the toolkit), for `helm upgrade --install NAME OUT/chart`
    OUT/image/          Dockerfile.gpu and Dockerfile.cpu: the toolkit image the pods run
    OUT/deploy.json     what was deployed (repository, build key, fingerprint) and the commands

OUT is written into a temporary sibling and swapped into place; an OUT that toolkit deploy did not
write (no deploy.json of ours) is refused unless it is empty.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from toolkit import __version__
from toolkit.deploy.plan import DeploymentPlan
from toolkit.deploy.text import comment_line
from toolkit.deploy.values import chart_source
from toolkit.errors import DeployError
from toolkit.fsutil import file_lock, make_world_readable
from toolkit.signals import deferred_interrupts

RECORD = "deploy.json"
GENERATOR = "toolkit deploy"
_CHART_IGNORED = ("image", "__pycache__")


@dataclass(frozen=True)
class DeploymentResult:
    path: Path
    values: Path
    chart: Path
    commands: list[str]


def write_deployment(plan: DeploymentPlan, output: Path) -> DeploymentResult:
    output = Path(output).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    commands = plan.commands(output)
    with file_lock(output.parent / f".{output.name}.lock"):
        _refuse_foreign(output)
        staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.writing-", dir=output.parent))
        try:
            make_world_readable(staging)
            _render(plan, staging, commands)
            with deferred_interrupts():
                _swap_into_place(staging, output)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return DeploymentResult(output, output / "values.yaml", output / "chart", commands)


def is_deployment_folder(folder: Path) -> bool:
    try:
        data = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("generator") == GENERATOR


def _refuse_foreign(output: Path) -> None:
    if not output.exists():
        return
    if not output.is_dir():
        raise DeployError(
            f"-o {output} is a file, not a folder; refusing to replace it", hint="choose another -o"
        )
    if is_deployment_folder(output) or not any(output.iterdir()):
        return
    raise DeployError(
        f"{output} exists, is not empty and was not written by toolkit deploy (no {RECORD} of ours); "
        "nothing in it was touched",
        hint="choose another -o, or remove that folder yourself",
    )


def _render(plan: DeploymentPlan, root: Path, commands: list[str]) -> None:
    source = chart_source()
    shutil.copytree(source, root / "chart", ignore=shutil.ignore_patterns(*_CHART_IGNORED))
    shutil.copytree(source / "image", root / "image")
    header = (  # one line each, whatever the path holds: a line break would start YAML of its own
        f"# Written by toolkit deploy {__version__} for {comment_line(str(plan.repository.path))}\n"
        f"# ({plan.target}, build key {plan.repository.manifest.build_key}, fingerprint {plan.fingerprint}).\n"
        "# Install: " + comment_line(commands[-1]) + "\n"
    )
    (root / "values.yaml").write_text(header + yaml.safe_dump(plan.values, sort_keys=False))
    record = {
        "generator": GENERATOR,
        "toolkit_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **plan.to_dict(),
        "commands": commands,
    }
    (root / RECORD).write_text(json.dumps(record, indent=2) + "\n")


def _swap_into_place(staging: Path, output: Path) -> None:
    """Rename the old folder away, the new one in, then remove the old: never half of either in place."""
    old = None
    if output.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old-", dir=output.parent))
        os.rmdir(old)
        os.replace(output, old)
    os.replace(staging, output)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
