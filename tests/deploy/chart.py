"""The chart in deploy/ as the deploy tests use it: `toolkit deploy` through the CLI, the real helm
(scripts/install_k8s_tools.sh) rendering what it wrote, and look-ups in the rendered objects.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from toolkit.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]  # the checkout
DATA = ROOT / "tests" / "data"
K8S = DATA / "k8s"
LLAMA_8B = DATA / "llama-3.1-8b-instruct" / "config.json"
HELM_VERSION = "v3.17.3"
# The chart's kubeVersion floor and the newest Kubernetes kubernetes-validate 1.37 ships schemas for.
KUBE_VERSIONS = ("1.29.0", "1.37.0")
CRD_APIS = (
    "inference.networking.k8s.io/v1/InferencePool",
    "gateway.networking.k8s.io/v1/HTTPRoute",
    "keda.sh/v1alpha1/ScaledObject",
    "monitoring.coreos.com/v1/PodMonitor",
)
IMAGE = "registry.example.com/ml/toolkit"
CHART_SCHEMA = json.loads((ROOT / "deploy" / "values.schema.json").read_text())
RELEASE, NAMESPACE = "llm", "serving"
HUB_REVISION = (
    "0e9e39f249a16976918f6564b8830bc894c89659"  # a 40-hex commit, as a hub build records it
)


# --- tools ----------------------------------------------------------------------------------------
def find_helm() -> str:
    """The pinned helm (scripts/install_k8s_tools.sh puts it beside the interpreter); a failure, never a skip."""
    found = shutil.which("helm", path=f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin")
    if found is None:
        pytest.fail(
            "helm is not installed: run scripts/install_k8s_tools.sh .venv/bin (scripts/setup.sh does)"
        )
    version = subprocess.run(
        [found, "version", "--short"], capture_output=True, text=True, check=True
    )
    assert version.stdout.startswith(HELM_VERSION), version.stdout
    return found


def invoke(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args])


def deploy(repo: Path, out: Path, *args) -> dict:
    """`toolkit deploy` through the CLI; the values it wrote."""
    result = invoke("deploy", "--repo", repo, "-o", out, "--image", IMAGE, *args)
    assert result.exit_code == 0, result.output
    values = yaml.safe_load((out / "values.yaml").read_text())
    assert chart_schema_errors(values) == []  # what toolkit deploy writes, helm's schema takes
    return values


def chart_schema_errors(values: dict) -> list[str]:
    """deploy/values.schema.json's errors, as helm would report them for these values."""
    validator = jsonschema.Draft7Validator(CHART_SCHEMA)
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(values)
    ]


def helm_template(
    helm,
    out: Path,
    *,
    apis=CRD_APIS,
    kube=KUBE_VERSIONS[0],
    extra=(),
    release: str = RELEASE,
    namespace: str = NAMESPACE,
) -> subprocess.CompletedProcess:
    argv = [
        helm,
        "template",
        release,
        out / "chart",
        "-f",
        out / "values.yaml",
        "--namespace",
        namespace,
    ]
    argv += ["--kube-version", kube, *(f"--api-versions={api}" for api in apis), *extra]
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True)


def render(helm, out: Path, **kw) -> list[dict]:
    result = helm_template(helm, out, **kw)
    assert result.returncode == 0, result.stderr
    blank = [n for n, line in enumerate(result.stdout.splitlines(), 1) if line and not line.strip()]
    assert not blank, f"whitespace-only lines {blank} in the render (a template's empty output)"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def write_values(path: Path, values: dict) -> Path:
    path.write_text(yaml.safe_dump(values))
    return path


# --- repositories ---------------------------------------------------------------------------------
def hub_variant(repo: Path, tmp: Path, source: str = "hf:meta-llama/Llama-3.1-8B-Instruct") -> Path:
    """A copy of `repo` whose manifest says what a hub build records (the fakes cannot reach the hub);
    the engine stays where the manifest names it."""
    copy = tmp / "hub-repo"
    shutil.copytree(repo, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["model"].update(source=source, revision=HUB_REVISION)
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return copy


# --- the rendered objects -------------------------------------------------------------------------
def find(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, (
        f"{len(found)} {kind} objects named {name}: {[d['metadata']['name'] for d in found]}"
    )
    return found[0]


def server_deployment(docs: list[dict]) -> dict:
    return find(docs, "Deployment", RELEASE)


def container(pod_spec: dict, name: str) -> dict:
    return next(c for c in pod_spec["containers"] if c["name"] == name)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def build_container(docs: list[dict]) -> dict:
    """The build Job's `toolkit build` (its init container; the container after it checks the result)."""
    (build,) = find(docs, "Job")["spec"]["template"]["spec"]["initContainers"]
    return build


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_templates(docs: list[dict]) -> list[tuple[str, dict]]:
    return [
        (f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"])
        for d in docs
        if d["kind"] in ("Deployment", "Job")
    ]


def epp_config(docs: list[dict]) -> dict:
    deployment = find(docs, "Deployment", f"{RELEASE}-epp")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    path = Path(flag(args, "--config-file"))
    configmap = find(docs, "ConfigMap", f"{RELEASE}-epp")
    return yaml.safe_load(configmap["data"][path.name])


def engine_specs(config: dict) -> dict[str, str]:
    extractor = next(p for p in config["plugins"] if p["type"] == "core-metrics-extractor")
    engine = next(
        e
        for e in extractor["parameters"]["engineConfigs"]
        if e["name"] == extractor["parameters"]["defaultEngine"]
    )
    return {k: v for k, v in engine.items() if k.endswith("Spec")}


def gateway_seconds(duration: str) -> float:
    """Seconds of a Gateway API duration (GEP-2257: 1h2m3s, 500ms)."""
    parts = re.findall(r"([0-9]+)(h|ms|m|s)", duration)
    assert "".join(n + u for n, u in parts) == duration, duration
    unit = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(int(n) * unit[u] for n, u in parts)
