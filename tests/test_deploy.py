"""`toolkit deploy` and the chart in deploy/, checked by construction where no cluster runs here.

The chart is rendered with the real helm (scripts/install_k8s_tools.sh) for a CPU repository and
for an H100 FP8 repository built through the fake TensorRT-LLM tools. Every rendered object is
validated offline: built-in kinds with kubernetes-validate (strict, against the chart's floor and
the newest Kubernetes it knows), custom resources and the endpoint picker's config against the
schemas transcribed into tests/data/k8s/ (each file names its source and tag), plus the API
server's and the controllers' cross-object rules (selectors match, named ports exist, the grace
period covers the drain). Live checks against a served repository are in test_deploy_live.py.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import referencing
import yaml
from click.testing import CliRunner
from kubernetes_validate.utils import SchemaNotFoundError
from kubernetes_validate.utils import ValidationError as KubeValidationError

from toolkit.api.metrics import ApiMetrics
from toolkit.cli.cmd_build import command as build_command
from toolkit.cli.main import cli
from toolkit.deploy.fingerprint import fingerprint
from toolkit.deploy.probe import TIMEOUT_S as PROBE_TIMEOUT_S
from toolkit.deploy.wait import check_repository_for, wait_for_repository
from toolkit.errors import DeployError, RepositoryError
from toolkit.model.facts import facts_from_config
from toolkit.model.sources import ResolvedModel
from toolkit.plan.gpus import GPU_PROFILES, get_gpu
from toolkit.plan.memory import plan_memory
from toolkit.repository.reader import open_repository

from fakes import fake_checkpoint, install_fake_trtllm
from repos import python_repository
from tiny import make_tiny_checkpoint

DATA = Path(__file__).parent / "data"
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
CHART_SCHEMA = json.loads((Path(__file__).parents[1] / "deploy" / "values.schema.json").read_text())
RELEASE, NAMESPACE = "llm", "serving"
HUB_REVISION = (
    "0e9e39f249a16976918f6564b8830bc894c89659"  # a 40-hex commit, as a hub build records it
)
CRD_SCHEMAS = {
    (
        "inference.networking.k8s.io/v1",
        "InferencePool",
    ): "inferencepool.inference.networking.k8s.io_v1",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute.gateway.networking.k8s.io_v1",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.keda.sh_v1alpha1",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor.monitoring.coreos.com_v1",
}
EPP_SCHEMA = "endpointpickerconfig.inference.networking.x-k8s.io_v1alpha1"
GIE = json.loads((K8S / "gateway-api-inference-extension_v1.5.0.json").read_text())
PORT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")  # IANA_SVC_NAME, at most 15 characters
METRIC_SPEC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^{}]*)\})?$")
PROMQL_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^{}]*)\}")
# Labels Prometheus gives every series a PodMonitor scrapes (prometheus-operator v0.93.0,
# pkg/prometheus/promcfg.go generatePodMonitorConfig); the rest come from the exporter.
TARGET_LABELS = ("namespace", "pod", "container", "endpoint", "job")


# --- tools --------------------------------------------------------------------------------------
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


@pytest.fixture(scope="session")
def helm() -> str:
    return find_helm()


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
    helm, out: Path, *, apis=CRD_APIS, kube=KUBE_VERSIONS[0], extra=()
) -> subprocess.CompletedProcess:
    argv = [
        helm,
        "template",
        RELEASE,
        out / "chart",
        "-f",
        out / "values.yaml",
        "--namespace",
        NAMESPACE,
    ]
    argv += ["--kube-version", kube, *(f"--api-versions={api}" for api in apis), *extra]
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True)


def render(helm, out: Path, **kw) -> list[dict]:
    result = helm_template(helm, out, **kw)
    assert result.returncode == 0, result.stderr
    blank = [n for n, line in enumerate(result.stdout.splitlines(), 1) if line and not line.strip()]
    assert not blank, f"whitespace-only lines {blank} in the render (a template's empty output)"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


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


# --- repositories -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cpu_repo(tmp_path_factory) -> Path:
    """A CPU repository of a tiny checkpoint whose manifest names a pinned hub revision (what a
    `toolkit build --model hf:ORG/NAME` records), under a folder that stands for the volume."""
    tmp = tmp_path_factory.mktemp("cpu")
    checkpoint = make_tiny_checkpoint(tmp / "checkpoint")
    model = ResolvedModel(checkpoint, "hf:acme/tiny-llama", HUB_REVISION)
    return python_repository(
        model,
        tmp / "volume" / "repo",
        max_input_len=128,
        max_output_len=64,
        max_seq_len=256,
        kv_cache_tokens=1024,
    )


@pytest.fixture(scope="module")
def gpu_repo(tmp_path_factory) -> Path:
    """An H100 FP8, TP=2 repository built by `toolkit build` through the fake TensorRT-LLM tools,
    repository and engine on one folder that stands for the volume."""
    tmp = tmp_path_factory.mktemp("gpu")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOOLKIT_HOME", str(tmp / "home"))
        install_fake_trtllm(mp, tmp)
        checkpoint = fake_checkpoint(tmp, LLAMA_8B)
        tiny = make_tiny_checkpoint(tmp / "tiny")
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(tiny / name, checkpoint / name)
        (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
        volume = tmp / "volume"
        result = invoke(
            "build", "--target", "h100-sxm", "--model", checkpoint, "--dtype", "fp8", "--kv-dtype", "fp8",
            "--tp", "2", "--output", volume / "repo", "--engine-dir", volume / "engines" / "llama-h100-fp8-tp2",
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    return volume / "repo"


def hub_variant(repo: Path, tmp: Path, source: str = "hf:meta-llama/Llama-3.1-8B-Instruct") -> Path:
    """A copy of `repo` whose manifest says what a hub build records (the fakes cannot reach the hub);
    the engine stays where the manifest names it."""
    copy = tmp / "hub-repo"
    shutil.copytree(repo, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["model"].update(source=source, revision=HUB_REVISION)
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return copy


# --- validation ---------------------------------------------------------------------------------
def _registry() -> referencing.Registry:
    resources = []
    for path in K8S.glob("*.schema.json"):
        schema = json.loads(path.read_text())
        resources.append((schema["$id"], referencing.Resource.from_contents(schema)))
    return referencing.Registry().with_resources(resources)


REGISTRY = _registry()


def schema_errors(name: str, instance) -> list[str]:
    schema = json.loads((K8S / f"{name}.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema, registry=REGISTRY)
    return [
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator.iter_errors(instance)
    ]


def object_errors(doc: dict, kube_version: str) -> list[str]:
    """Strict schema errors of one rendered object; an object no schema covers is an error too."""
    where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CRD_SCHEMAS:
        return [f"{where}: {e}" for e in schema_errors(CRD_SCHEMAS[key], doc)]
    try:
        kubernetes_validate.validate(doc, kube_version, strict=True)
    except SchemaNotFoundError:
        return [
            f"{where}: no schema for {key[0]} {key[1]} (kubernetes-validate only warns; add one to tests/data/k8s)"
        ]
    except KubeValidationError as exc:
        return [f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}"]
    return []


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_templates(docs: list[dict]) -> list[tuple[str, dict]]:
    return [
        (f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"])
        for d in docs
        if d["kind"] in ("Deployment", "Job")
    ]


def _pod_errors(where: str, template: dict, docs: list[dict]) -> list[str]:
    """The API server's pod rules the OpenAPI schema does not carry, and references to other objects."""
    errors, spec = [], template["spec"]
    containers = spec.get("initContainers", []) + spec["containers"]
    names = [c["name"] for c in containers]
    if len(names) != len(set(names)):
        errors.append(f"{where}: duplicate container names {names}")
    ports = [p for c in spec["containers"] for p in c.get("ports", [])]
    port_names = [p["name"] for p in ports]
    if len(port_names) != len(set(port_names)) or len({p["containerPort"] for p in ports}) != len(
        ports
    ):
        errors.append(f"{where}: duplicate container port names or numbers {ports}")
    for name in port_names:
        if (
            len(name) > 15
            or not PORT_NAME.match(name)
            or "--" in name
            or not re.search("[a-z]", name)
        ):
            errors.append(f"{where}: port name {name!r} is not an IANA_SVC_NAME")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for c in containers:
        own = {p["name"] for p in c.get("ports", [])}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            port = c.get(probe, {}).get("httpGet", {}).get("port")
            if isinstance(port, str) and port not in own:
                errors.append(
                    f"{where}: {c['name']}.{probe} names port {port!r}, not one of {sorted(own)}"
                )
        for mount in c.get("volumeMounts", []):
            if mount["name"] not in volumes:
                errors.append(
                    f"{where}: {c['name']} mounts {mount['name']!r}, which is no volume of the pod"
                )
    for volume in volumes.values():
        if "configMap" in volume and not any(
            d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"]
            for d in docs
        ):
            errors.append(f"{where}: ConfigMap {volume['configMap']['name']} is not rendered")
        claim = volume.get("persistentVolumeClaim", {}).get("claimName")
        if claim and not any(
            d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] == claim for d in docs
        ):
            errors.append(f"{where}: PersistentVolumeClaim {claim} is not rendered")
    account = spec.get("serviceAccountName")
    if account and not any(
        d["kind"] == "ServiceAccount" and d["metadata"]["name"] == account for d in docs
    ):
        errors.append(f"{where}: ServiceAccount {account} is not rendered")
    return errors


def _selected_pod(docs: list[dict], selector: dict, what: str) -> tuple[dict | None, list[str]]:
    pods = [t for _, t in pod_templates(docs) if matches(selector, t["metadata"]["labels"])]
    pods = [t for t in pods if "restartPolicy" not in t["spec"]]  # Jobs' pods serve nothing
    if len(pods) != 1:
        return None, [f"{what}: selector {selector} matches {len(pods)} serving pod templates"]
    return pods[0], []


def _container_ports(template: dict) -> dict[str, int]:
    return {
        p["name"]: p["containerPort"]
        for c in template["spec"]["containers"]
        for p in c.get("ports", [])
    }


def cross_object_errors(docs: list[dict]) -> list[str]:
    errors = []
    for d in docs:
        if d["kind"] == "Deployment" and not matches(
            d["spec"]["selector"]["matchLabels"], d["spec"]["template"]["metadata"]["labels"]
        ):
            errors.append(
                f"Deployment/{d['metadata']['name']}: selector does not match its pod template"
            )
    for where, template in pod_templates(docs):
        errors += _pod_errors(where, template, docs)
    for d in docs:
        where = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] == "Service":
            pod, problems = _selected_pod(docs, d["spec"]["selector"], where)
            errors += problems
            for port in d["spec"]["ports"] if pod else ():
                if isinstance(port["targetPort"], str) and port[
                    "targetPort"
                ] not in _container_ports(pod):
                    errors.append(
                        f"{where}: targetPort {port['targetPort']!r} is no container port of its pods"
                    )
        elif d["kind"] in ("PodMonitor", "PodDisruptionBudget", "NetworkPolicy"):
            selector = d["spec"]["podSelector" if d["kind"] == "NetworkPolicy" else "selector"][
                "matchLabels"
            ]
            pod, problems = _selected_pod(docs, selector, where)
            errors += problems
            wanted = [e["port"] for e in d["spec"].get("podMetricsEndpoints", [])]
            wanted += [
                p["port"] for rule in d["spec"].get("ingress", []) for p in rule.get("ports", [])
            ]
            for port in wanted if pod else ():
                if isinstance(port, str) and port not in _container_ports(pod):
                    errors.append(f"{where}: port {port!r} is no container port of its pods")
        elif d["kind"] == "InferencePool":
            errors += _pool_errors(d, docs)
        elif d["kind"] == "HTTPRoute":
            for ref in (r for rule in d["spec"]["rules"] for r in rule["backendRefs"]):
                kind = ref.get("kind", "Service")
                if kind == "Service" and ref.get("group", "") == "" and "port" not in ref:
                    errors.append(
                        f"{where}: a Service backendRef needs a port (CEL rule of the CRD)"
                    )
                if not any(
                    o["kind"] == kind and o["metadata"]["name"] == ref["name"] for o in docs
                ):
                    errors.append(f"{where}: backendRef {kind}/{ref['name']} is not rendered")
        elif d["kind"] == "ScaledObject":
            errors += _scaledobject_errors(d, docs)
    return errors


def _pool_errors(pool: dict, docs: list[dict]) -> list[str]:
    where, spec = f"InferencePool/{pool['metadata']['name']}", pool["spec"]
    numbers = [p["number"] for p in spec["targetPorts"]]
    errors = (
        [] if len(numbers) == len(set(numbers)) else [f"{where}: port number must be unique (CEL)"]
    )
    ref = spec["endpointPickerRef"]
    if ref.get("kind", "Service") == "Service" and "port" not in ref:
        errors.append(f"{where}: endpointPickerRef.port is required for a Service (CEL)")
    pod, problems = _selected_pod(docs, spec["selector"]["matchLabels"], where)
    errors += problems
    if pod and not set(numbers) <= set(_container_ports(pod).values()):
        errors.append(f"{where}: targetPorts {numbers} are not container ports of its pods")
    service = next(
        (d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == ref["name"]), None
    )
    if service is None or ref["port"]["number"] not in [
        p["port"] for p in service["spec"]["ports"]
    ]:
        errors.append(f"{where}: endpointPickerRef {ref} names no rendered Service port")
    return errors


def _scaledobject_errors(scaled: dict, docs: list[dict]) -> list[str]:
    """KEDA's admission webhook (v2.20.2 scaledobject_webhook.go) and the PodMonitor's series labels."""
    where, spec = f"ScaledObject/{scaled['metadata']['name']}", scaled["spec"]
    errors = []
    target = spec["scaleTargetRef"]
    if not any(
        d["kind"] == target.get("kind", "Deployment") and d["metadata"]["name"] == target["name"]
        for d in docs
    ):
        errors.append(f"{where}: scaleTargetRef {target} is not rendered")
    if spec.get("minReplicaCount", 0) > spec.get("maxReplicaCount", 100):
        errors.append(f"{where}: minReplicaCount > maxReplicaCount")
    names = [t.get("name") for t in spec["triggers"] if t.get("name")]
    if len(names) != len(set(names)):
        errors.append(f"{where}: trigger names must be unique")
    if len(f"keda-hpa-{scaled['metadata']['name']}") > 63:
        errors.append(f"{where}: keda-hpa-<name> is over 63 characters")
    if "fallback" in spec and all(t["type"] in ("cpu", "memory") for t in spec["triggers"]):
        errors.append(f"{where}: a fallback needs a trigger that is not cpu or memory")
    monitor = find(docs, "PodMonitor")
    namespace = monitor["metadata"]["namespace"]
    expected = {"namespace": namespace, "job": f"{namespace}/{monitor['metadata']['name']}"}
    for trigger in spec["triggers"]:
        if trigger["type"] in ("cpu", "memory"):
            errors.append(
                f"{where}: scales on {trigger['type']}, which says nothing about an LLM server's load"
            )
        for _, labels in promql_selectors(trigger["metadata"]["query"]):
            for label, value in labels.items():
                if label in TARGET_LABELS and expected.get(label) != value:
                    errors.append(
                        f"{where}: {label}={value!r}, but the PodMonitor's series carry {expected.get(label)!r}"
                    )
    return errors


def epp_config(docs: list[dict]) -> dict:
    deployment = find(docs, "Deployment", f"{RELEASE}-epp")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    path = Path(flag(args, "--config-file"))
    configmap = find(docs, "ConfigMap", f"{RELEASE}-epp")
    return yaml.safe_load(configmap["data"][path.name])


def epp_errors(docs: list[dict]) -> list[str]:
    """The endpoint picker: its config (strict, as the EPP decodes it), its flags, what it scrapes."""
    config = epp_config(docs)
    errors = [f"EndpointPickerConfig: {e}" for e in schema_errors(EPP_SCHEMA, config)]
    names = [p.get("name") or p["type"] for p in config["plugins"]]
    if len(names) != len(set(names)):
        errors.append("EndpointPickerConfig: duplicate plugin names")
    refs = [p["pluginRef"] for profile in config["schedulingProfiles"] for p in profile["plugins"]]
    refs += [s["pluginRef"] for s in config.get("dataLayer", {}).get("sources", [])]
    refs += [
        e["pluginRef"]
        for s in config.get("dataLayer", {}).get("sources", [])
        for e in s.get("extractors", [])
    ]
    errors += [
        f"EndpointPickerConfig: pluginRef {r} names no plugin" for r in refs if r not in names
    ]
    for spec in engine_specs(config).values():
        if (spec and not METRIC_SPEC.match(spec)) or '"' in spec:
            errors.append(f"EndpointPickerConfig: {spec!r} is not NAME{{k=v,...}} (no quotes)")
    epp = find(docs, "Deployment", f"{RELEASE}-epp")["spec"]["template"]["spec"]["containers"][0]
    given = [a[2:].split("=", 1)[0] for a in epp["args"] if a.startswith("--")]
    errors += [
        f"EPP flag --{f} does not exist in v1.5.0"
        for f in given
        if f not in GIE["flags"]["accepted"]
    ]
    errors += [
        f"EPP flag --{f} stops v1.5.0 at start"
        for f in given
        if f in GIE["flags"]["rejected_when_set"]["flags"]
    ]
    errors += _epp_rbac_errors(epp["args"], docs)
    pool = find(docs, "InferencePool")
    if flag(epp["args"], "--pool-name") != pool["metadata"]["name"]:
        errors.append("EPP --pool-name is not the InferencePool's name")
    server_pod = server_deployment(docs)["spec"]["template"]
    metrics_port = int(flag(epp["args"], "--model-server-metrics-port"))
    if (
        metrics_port != _container_ports(server_pod)["metrics"]
        or len(pool["spec"]["targetPorts"]) != 1
    ):
        errors.append(
            "EPP scrapes podIP:--model-server-metrics-port only with one pool target port: Triton's metrics port"
        )
    return errors


def _epp_rbac_errors(args: list[str], docs: list[dict]) -> list[str]:
    """A flag that is on (given, or by v1.5.0's default) and needs cluster RBAC needs a ClusterRole for it."""
    errors = []
    needs = {k: v for k, v in GIE["flags"]["cluster_rbac_when_true"].items() if k != "source"}
    granted = {
        f"{group}/{resource}"
        for d in docs
        if d["kind"] == "ClusterRole"
        for rule in d.get("rules", [])
        if "create" in rule.get("verbs", [])
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
    }
    for name, resources in needs.items():
        on = GIE["flags"]["defaults"][name]
        for arg in args:
            if arg in (f"--{name}", f"--{name}=true"):
                on = True
            elif arg == f"--{name}=false":
                on = False
        missing = sorted(set(resources) - granted)
        if on and missing:
            errors.append(f"EPP --{name} is on, and no ClusterRole lets it create {missing}")
    return errors


def engine_specs(config: dict) -> dict[str, str]:
    extractor = next(p for p in config["plugins"] if p["type"] == "core-metrics-extractor")
    engine = next(
        e
        for e in extractor["parameters"]["engineConfigs"]
        if e["name"] == extractor["parameters"]["defaultEngine"]
    )
    return {k: v for k, v in engine.items() if k.endswith("Spec")}


def promql_selectors(query: str) -> list[tuple[str, dict]]:
    """(metric, {label: value}) of every selector in a query; only `label="value"` matchers are allowed."""
    found = []
    for name, body in PROMQL_SELECTOR.findall(query):
        labels = {}
        for matcher in filter(None, (m.strip() for m in body.split(","))):
            match = re.fullmatch(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"', matcher)
            assert match, f"{matcher!r} in {query!r} is not an equality matcher"
            labels[match.group(1)] = match.group(2)
        found.append((name, labels))
    return found


PROMQL_TOKEN = re.compile(
    r"\s*(?:(?P<number>[0-9]+(?:\.[0-9]+)?)|(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<matchers>\{[^{}]*\})?"
    r"|(?P<punct>[-+(),*]))"
)


def promql_value(query: str, series: list[tuple[str, dict, float]]) -> float | None:
    """The value KEDA reads from `query` over `series` (metric, labels, value): the PromQL the
    ScaledObject uses (selectors with = matchers, sum, sum by, clamp_min, + and - matching on
    identical label sets, a number times an expression). None when the result is empty (KEDA: no
    value, its fallback)."""
    tokens = [m for m in PROMQL_TOKEN.finditer(query)]
    assert "".join(m.group(0) for m in tokens).strip() == query.strip(), query
    position = 0

    def take(text: str | None = None):
        nonlocal position
        token = tokens[position]
        assert text is None or token.group(0).strip() == text, (query, position, text)
        position += 1
        return token

    def peek() -> str:
        return tokens[position].group(0).strip() if position < len(tokens) else ""

    def term() -> dict:
        token = take()
        if token.group("number"):
            take("*")
            return {k: float(token.group("number")) * v for k, v in term().items()}
        name = token.group("name")
        if name == "clamp_min":
            take("(")
            inner = expression()
            take(",")
            low = float(take().group("number"))
            take(")")
            return {k: max(v, low) for k, v in inner.items()}
        if name == "sum":
            by: tuple[str, ...] = ()
            if peek() == "by":
                take("by")
                take("(")
                by = (take().group("name"),)
                take(")")
            take("(")
            inner = expression()
            take(")")
            out: dict = {}
            for key, value in inner.items():
                group = tuple((k, v) for k, v in key if k in by)
                out[group] = out.get(group, 0.0) + value
            return out
        if token.group(0).strip() == "(":
            inner = expression()
            take(")")
            return inner
        wanted = (
            dict(promql_selectors(token.group(0).strip())[0][1]) if token.group("matchers") else {}
        )
        return {
            tuple(sorted(labels.items())): float(value)
            for metric, labels, value in series
            if metric == name and all(labels.get(k) == v for k, v in wanted.items())
        }

    def expression() -> dict:
        left = term()
        while peek() in ("+", "-"):
            sign = 1 if take().group(0).strip() == "+" else -1
            right = term()
            left = {k: v + sign * right[k] for k, v in left.items() if k in right}
        return left

    result = expression()
    assert position == len(tokens), query
    assert len(result) <= 1, f"{query} returns {len(result)} series: KEDA needs one"
    return next(iter(result.values()), None)


def spec_selector(spec: str) -> tuple[str, dict]:
    """An EPP metric spec NAME{k=v,...} as (metric, labels), by its grammar (metrics_spec.go)."""
    match = METRIC_SPEC.match(spec)
    assert match, spec
    pairs = [p.split("=") for p in (match.group(3) or "").split(",") if p.strip()]
    return match.group(1), {k.strip(): v.strip() for k, v in pairs}


def validation_errors(docs: list[dict]) -> list[str]:
    errors = [e for version in KUBE_VERSIONS for doc in docs for e in object_errors(doc, version)]
    errors += cross_object_errors(docs)
    if any(d["kind"] == "InferencePool" for d in docs):
        errors += epp_errors(docs)
    return errors


# --- the validators catch what they are for ---------------------------------------------------
def test_the_validators_refuse_broken_objects(helm, cpu_repo, tmp_path):
    deploy(cpu_repo, tmp_path / "d", "--max-replicas", "3")
    docs = render(helm, tmp_path / "d")
    assert validation_errors(docs) == []
    broken = json.loads(json.dumps(docs))
    server_deployment(broken)["spec"]["template"]["spec"]["containers"][0]["extraField"] = 1
    find(broken, "ScaledObject")["spec"]["triggers"][0]["metadata"]["threshold"] = 4
    ports = find(broken, "InferencePool")["spec"]["targetPorts"]
    ports.append(dict(ports[0]))
    find(broken, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["port"] = "nope"
    find(broken, "Service", RELEASE)["spec"]["ports"][0]["targetPort"] = "grpc"
    epp = find(broken, "ConfigMap", f"{RELEASE}-epp")
    config = yaml.safe_load(epp["data"]["epp-config.yaml"])
    config["plugins"][2]["parameters"]["blockSize_tokens"] = 64
    epp["data"]["epp-config.yaml"] = yaml.safe_dump(config)
    epp_args = find(broken, "Deployment", f"{RELEASE}-epp")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    epp_args.remove("--metrics-endpoint-auth=false")
    broken.append({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})
    errors = "\n".join(validation_errors(broken))
    for expected in (
        "extraField",
        "threshold",
        "port number must be unique",
        "port 'nope' is no container port",
        "targetPort 'grpc'",
        "blockSize_tokens",
        "no schema for example.com/v1 Widget",
        "EPP --metrics-endpoint-auth is on",
    ):
        assert expected in errors


# --- renders ------------------------------------------------------------------------------------
def test_cpu_deployment_renders_and_every_object_validates(helm, cpu_repo, tmp_path):
    values = deploy(cpu_repo, tmp_path / "d", "--min-replicas", "2", "--max-replicas", "6")
    # helm lint knows no --api-versions: it checks the chart where no CRD is installed.
    lint = subprocess.run(
        [helm, "lint", tmp_path / "d" / "chart", "-f", tmp_path / "d" / "values.yaml", "--strict",
         "--set", "autoscaling.enabled=false,monitoring.podMonitor.enabled=false"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert lint.returncode == 0, lint.stdout + lint.stderr
    for kube in KUBE_VERSIONS:
        docs = render(helm, tmp_path / "d", kube=kube)
        assert validation_errors(docs) == []
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["ConfigMap", "Deployment", "Deployment", "HTTPRoute", "InferencePool", "Job", "NetworkPolicy",
         "PersistentVolumeClaim", "PodDisruptionBudget", "PodMonitor", "Role", "RoleBinding", "ScaledObject",
         "Service", "Service", "ServiceAccount"]
    )  # fmt: skip
    pod = server_deployment(docs)["spec"]["template"]["spec"]
    assert "replicas" not in server_deployment(docs)["spec"]  # KEDA owns the count
    triton = container(pod, "triton")
    assert "nvidia.com/gpu" not in json.dumps(triton["resources"]) and "affinity" not in pod
    assert values["model"]["fingerprint"] == fingerprint(open_repository(cpu_repo).manifest)
    job = build_container(docs)
    assert (
        job["args"][:2] == ["--model", f"hf:acme/tiny-llama@{HUB_REVISION}"]
        and "--engine-dir" not in job["args"]
    )


@pytest.fixture(scope="module")
def gpu_render(helm, gpu_repo, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu-render")
    repo = hub_variant(gpu_repo, tmp)
    values = deploy(repo, tmp / "d", "--min-replicas", "2", "--max-replicas", "8")
    return repo, values, render(helm, tmp / "d"), render(helm, tmp / "d", kube=KUBE_VERSIONS[1])


def test_h100_fp8_deployment_renders_and_every_object_validates(gpu_render):
    repo, values, docs, docs_newest = gpu_render
    assert validation_errors(docs) == [] and validation_errors(docs_newest) == []
    manifest = open_repository(repo).manifest
    pod = server_deployment(docs)["spec"]["template"]["spec"]
    triton = container(pod, "triton")
    # Built on the Triton container that carries TensorRT-LLM 0.20.0, the release of the engines.
    assert triton["image"] == f"{IMAGE}:0.1.0-25.06-trtllm-python-py3"
    assert {"name": "OMPI_MCA_btl_vader_single_copy_mechanism", "value": "none"} in triton["env"]
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 2 == manifest.engine.world_size
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term == [
        {
            "matchExpressions": [
                {
                    "key": "nvidia.com/gpu.product",
                    "operator": "In",
                    "values": ["NVIDIA-H100-80GB-HBM3"],
                }
            ]
        }
    ]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert {v["name"]: v for v in pod["volumes"]}["shm"]["emptyDir"]["medium"] == "Memory"
    job = find(docs, "Job")["spec"]["template"]["spec"]
    build = build_container(docs)
    assert (
        build["resources"]["limits"]["nvidia.com/gpu"] == 2 and job["affinity"] == pod["affinity"]
    )
    assert flag(build["args"], "--engine-dir").startswith(
        f"/models/{RELEASE}/{values['model']['fingerprint']}/"
    )
    assert "HF_TOKEN" not in [e["name"] for e in build["env"]]  # no --hf-token-secret, no token


def test_hf_token_reaches_only_the_build_job_from_its_secret(helm, cpu_repo, tmp_path):
    deploy(
        cpu_repo, tmp_path / "d", "--hf-token-secret", "hub-token", "--api-key-secret", "llm-keys"
    )
    docs = render(helm, tmp_path / "d")
    build = build_container(docs)
    token = next(e for e in build["env"] if e["name"] == "HF_TOKEN")
    assert token == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hub-token", "key": "token"}},
    }
    pod = server_deployment(docs)["spec"]["template"]["spec"]
    assert "HF_TOKEN" not in json.dumps(pod)
    keys = {v["name"]: v for v in pod["volumes"]}["api-keys"]["secret"]
    assert (
        keys["secretName"] == "llm-keys"
        and flag(container(pod, "api")["args"], "--api-key-file") == "/etc/toolkit/api-keys/keys"
    )
    assert all(
        "value" not in e or "key" not in e["name"].lower()
        for c in pod["containers"]
        for e in c["env"]
    )


def test_build_job_arguments_are_accepted_by_toolkit_build_and_say_what_was_built(gpu_render):
    repo, _, docs, _ = gpu_render
    args = build_container(docs)["args"]
    # click parses them as `toolkit build` would: an unknown flag or a bad value is refused here.
    params = build_command.make_context("build", list(args)).params
    plan = open_repository(repo).memory_plan
    assert (
        params["model"] == f"hf:meta-llama/Llama-3.1-8B-Instruct@{HUB_REVISION}"
        and params["target"] == "h100-sxm"
    )
    assert (params["dtype"], params["kv_dtype"], params["tp"], params["pp"]) == ("fp8", "fp8", 2, 1)
    assert (params["max_batch_size"], params["max_num_tokens"], params["max_seq_len"]) == (
        plan.max_batch_size, plan.max_num_tokens, plan.max_seq_len,
    )  # fmt: skip
    assert params["output"] == Path(
        f"/models/{RELEASE}/{fingerprint(open_repository(repo).manifest)}/repository"
    )


def exec_probe_url(probe: dict) -> str:
    """The URL of an exec probe that runs toolkit.deploy.probe."""
    command = probe["exec"]["command"]
    assert command[:3] == ["python3", "-m", "toolkit.deploy.probe"], command
    return command[3]


def test_probes_grace_and_drain_agree_with_the_serve_commands(gpu_render):
    _, values, docs, _ = gpu_render
    deployment = server_deployment(docs)
    pod = deployment["spec"]["template"]["spec"]
    triton, api = container(pod, "triton"), container(pod, "api")
    prestop = int(triton["lifecycle"]["preStop"]["exec"]["command"][1])
    drain = int(flag(triton["args"], "--drain-timeout"))
    assert drain == int(flag(api["args"], "--drain-timeout")) == values["drain"]["timeoutSeconds"]
    # The kubelet's grace period covers preStop, the drain and toolkit serve's own 5 s past Triton's timeout.
    assert pod["terminationGracePeriodSeconds"] >= prestop + drain + 5
    assert pod["terminationGracePeriodSeconds"] == values["drain"]["terminationGracePeriodSeconds"]
    startup = triton["startupProbe"]
    # The kubelet kills at the failureThreshold-th failure, (threshold - 1) periods after the first
    # probe: only after toolkit serve's own --ready-timeout has passed and it has stopped tritonserver
    # (10 s) and printed why, with the log's tail (`kubectl logs --previous`).
    ready_timeout = int(flag(triton["args"], "--ready-timeout"))
    assert (startup["failureThreshold"] - 1) * startup["periodSeconds"] >= ready_timeout + 10 + 5
    # A hung Triton that fails its startup or liveness probe is killed after a short grace, not
    # after the drain's grace period while it holds the GPUs (probe-level grace: GA in 1.28).
    for kind in ("startupProbe", "livenessProbe"):
        assert 10 + 5 <= triton[kind]["terminationGracePeriodSeconds"] <= 30, kind
        assert triton[kind]["terminationGracePeriodSeconds"] < pod["terminationGracePeriodSeconds"]
    assert (
        "terminationGracePeriodSeconds" not in triton["readinessProbe"]
    )  # the API server refuses it
    http = int(flag(triton["args"], "--http-port"))
    assert (
        exec_probe_url(startup)
        == exec_probe_url(triton["readinessProbe"])
        == (f"http://127.0.0.1:{http}/v2/health/ready")
    )
    assert exec_probe_url(triton["livenessProbe"]) == f"http://127.0.0.1:{http}/v2/health/live"
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        # the probe's own HTTP timeout reports why before the kubelet kills it
        assert triton[kind]["timeoutSeconds"] > PROBE_TIMEOUT_S
    assert api["readinessProbe"]["httpGet"]["path"] == "/health"
    epp = find(docs, "Deployment", f"{RELEASE}-epp")["spec"]["template"]["spec"]
    assert epp["terminationGracePeriodSeconds"] == pod["terminationGracePeriodSeconds"]
    behavior = find(docs, "ScaledObject")["spec"]["advanced"]["horizontalPodAutoscalerConfig"][
        "behavior"
    ]
    load = values["startup"]["timeoutSeconds"]
    assert all(p["periodSeconds"] == load for p in behavior["scaleUp"]["policies"])
    assert (
        behavior["scaleDown"]["stabilizationWindowSeconds"] >= 2 * load
        or behavior["scaleDown"]["stabilizationWindowSeconds"] == 3600
    )
    # A rollout is reported stalled only after the image pull and the load could have happened
    # (Kubernetes' default is 600 s); the build is done before the Deployment is applied.
    assert deployment["spec"]["progressDeadlineSeconds"] == load + 600


def test_the_endpoint_picker_reads_the_backend_metric_names_it_knows_for_triton(gpu_render):
    repo, _, docs, _ = gpu_render
    config = epp_config(docs)
    builtin = GIE["builtin_engine_configs"]["triton-tensorrt-llm"]
    assert engine_specs(config) == {k: v for k, v in builtin.items() if k.endswith("Spec")}
    prefix = next(p for p in config["plugins"] if p["type"] == "prefix-cache-scorer")["parameters"]
    limits = open_repository(
        repo
    ).limits  # the KV pool the prefix index mirrors, in blocks of tokens
    assert (prefix["blockSizeTokens"], prefix["lruCapacityPerServer"]) == (
        limits.kv_block_size,
        limits.kv_cache_blocks,
    )
    pods = server_deployment(docs)["spec"]["template"]["metadata"]["labels"]
    assert pods[GIE["engine_label_key"]] == "triton-tensorrt-llm"


def test_without_the_extension_crds_a_plain_service_is_the_front_door(helm, cpu_repo, tmp_path):
    deploy(cpu_repo, tmp_path / "d")
    docs = render(
        helm,
        tmp_path / "d",
        apis=("monitoring.coreos.com/v1/PodMonitor", "gateway.networking.k8s.io/v1/HTTPRoute"),
    )
    assert validation_errors(docs) == []
    assert not [d for d in docs if d["kind"] in ("InferencePool", "ServiceAccount", "ConfigMap")]
    route = find(docs, "HTTPRoute")["spec"]["rules"][0]["backendRefs"]
    assert route == [{"group": "", "kind": "Service", "name": RELEASE, "port": 9000}]
    docs = render(helm, tmp_path / "d", apis=("monitoring.coreos.com/v1/PodMonitor",))
    assert [d["kind"] for d in docs if d["kind"] in ("HTTPRoute", "InferencePool")] == []
    assert find(docs, "Service", RELEASE)["spec"]["ports"][0]["targetPort"] == "http"


NO_KEDA = CRD_APIS[:2] + CRD_APIS[3:]
ONLY_MONITORING = ("monitoring.coreos.com/v1/PodMonitor",)


@pytest.mark.parametrize(
    ("apis", "extra", "message"),
    [
        (ONLY_MONITORING, ["--set", "routing.mode=inferencePool"], "no inference.networking.k8s.io/v1 InferencePool"),
        (NO_KEDA, [], "no keda.sh/v1alpha1 ScaledObject"),
        (CRD_APIS[:3], [], "no monitoring.coreos.com/v1 PodMonitor"),
        (CRD_APIS, ["--set", "gpu.count=1"], "gpu.count=1 for a cpu repository"),
        (CRD_APIS, ["--set", "api.auth.existingSecret="], "api.auth.existingSecret is empty"),
        (CRD_APIS, ["--set", "model.repositoryPath=/x/repo,build.enabled=false"], "not on the volume"),
        (CRD_APIS, ["--set", "model.fingerprintt=abc"], "Additional property fingerprintt is not allowed"),
        (CRD_APIS, ["--set", "autoscaling.scaleUp.periodSeconds=3600"], "less than or equal to 1800"),
        (CRD_APIS, ["--set", "drain.timeoutSeconds=900"], "shorter than drain.preStopSeconds + drain.timeoutSeconds"),
        (CRD_APIS, ["--set", "strategy.progressDeadlineSeconds=30"], "progressDeadlineSeconds=30 is shorter"),
        (CRD_APIS, ["--set", "routing.httpRoute.path=/"], "Additional property path is not allowed"),
    ],
)  # fmt: skip
def test_the_chart_refuses_values_that_cannot_run(helm, cpu_repo, tmp_path, apis, extra, message):
    deploy(cpu_repo, tmp_path / "d", "--max-replicas", "3")
    result = helm_template(helm, tmp_path / "d", apis=apis, extra=extra)
    assert result.returncode != 0 and message in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--set", "gpu.count=1"], "gpu.count=1, but the h100-sxm engines have 2 ranks"),
        (
            ["--set", "image.tag=0.1.0-25.02-trtllm-python-py3"],
            "is not built on nvcr.io/nvidia/tritonserver:25.06",
        ),
        (
            ["--set", "gpu.products=null", "--set", "gpu.targets.h200[0]=NVIDIA-H200"],
            "names only h200",
        ),
    ],
)
def test_the_chart_refuses_gpu_values_that_cannot_run(helm, gpu_render, tmp_path, extra, message):
    repo = gpu_render[0]
    deploy(repo, tmp_path / "d")
    result = helm_template(helm, tmp_path / "d", extra=extra)
    assert result.returncode != 0 and message in result.stderr, result.stderr


# --- toolkit deploy's refusals ------------------------------------------------------------------
def write_values(path: Path, values: dict) -> Path:
    path.write_text(yaml.safe_dump(values))
    return path


def test_cpu_repository_with_gpu_settings_is_refused(cpu_repo, tmp_path):
    cluster = write_values(
        tmp_path / "cluster.yaml", {"gpu": {"count": 1, "products": ["NVIDIA-H100-80GB-HBM3"]}}
    )
    result = invoke(
        "deploy", "--repo", cpu_repo, "-o", tmp_path / "d", "--image", IMAGE, "-f", cluster
    )
    assert result.exit_code == 1
    assert "asks for GPUs (gpu.count=1)" in result.output and "cpu repository" in result.output
    assert "fix: drop the gpu settings" in result.output and not (tmp_path / "d").exists()


def test_gpu_repository_with_a_missing_engine_is_refused(gpu_repo, tmp_path):
    repo = hub_variant(gpu_repo, tmp_path)
    engine = Path(open_repository(repo).manifest.engine.parameters["engine_dir"])
    moved = tmp_path / "rank1.engine"
    shutil.move(engine / "rank1.engine", moved)
    try:
        result = invoke("deploy", "--repo", repo, "-o", tmp_path / "d", "--image", IMAGE)
    finally:
        shutil.move(moved, engine / "rank1.engine")
    assert result.exit_code == 1
    assert (
        "engine of" in result.output
        and "missing or incomplete" in result.output
        and "rank1.engine" in result.output
    )
    assert "fix: rebuild it: toolkit build --target h100-sxm" in result.output


def test_an_engine_of_a_release_no_known_container_carries_is_refused(
    gpu_repo, tmp_path, monkeypatch
):
    """Such an engine would be sent to a container that cannot load it (the pinned one, before)."""
    import toolkit.trtllm

    monkeypatch.delitem(toolkit.trtllm.CONTAINERS, toolkit.trtllm.PINNED_TRTLLM_VERSION)
    result = invoke("deploy", "--repo", gpu_repo, "-o", tmp_path / "d", "--image", IMAGE)
    assert result.exit_code == 1, result.output
    assert "no Triton container the toolkit knows carries" in result.output
    assert "fix: rebuild it with TensorRT-LLM" in result.output
    assert not (tmp_path / "d").exists()


def test_gpu_target_the_cluster_values_do_not_name_is_refused(gpu_repo, tmp_path):
    repo = hub_variant(gpu_repo, tmp_path)
    cluster = write_values(
        tmp_path / "cluster.yaml",
        {"gpu": {"targets": {"h200": ["NVIDIA-H200"], "l40s": ["NVIDIA-L40S"]}}},
    )
    result = invoke("deploy", "--repo", repo, "-o", tmp_path / "d", "--image", IMAGE, "-f", cluster)
    assert result.exit_code == 1
    assert (
        "built for h100-sxm" in result.output
        and "name only these GPU targets: h200, l40s" in result.output
    )
    cluster = write_values(
        tmp_path / "cluster.yaml", {"gpu": {"targets": {"h100-sxm": ["NVIDIA-H100-SXM5-80GB"]}}}
    )
    values = deploy(repo, tmp_path / "d", "-f", cluster)
    assert values["gpu"]["products"] == [
        "NVIDIA-H100-SXM5-80GB"
    ]  # the cluster's own label spelling


@pytest.mark.parametrize(
    ("args", "cluster", "message"),
    [
        (
            ["--image", f"{IMAGE}:0.1.0-25.04-trtllm-python-py3"],
            {},
            "does not carry 25.06-trtllm-python-py3",
        ),
        (
            [],
            {"model": {"target": "h200"}},
            "sets `model`, which toolkit deploy takes from the repository",
        ),
        (
            [],
            {"gpu": {"count": 1}},
            "gpu.count=1 in the cluster values, but the h100-sxm engines have 2 ranks",
        ),
        (
            ["--max-replicas", "4", "--replicas", "5"],
            {},
            "--replicas 5 is a fixed count, but autoscaling is on (--max-replicas 4)",
        ),
        (
            ["--replicas", "3"],
            {"autoscaling": {"enabled": True, "maxReplicas": 4}},
            "autoscaling is on (autoscaling.enabled=true in ",
        ),
        (
            ["--max-replicas", "2", "--min-replicas", "3"],
            {},
            "1 <= floor <= ceiling: --min-replicas 3, --max-replicas 2",
        ),
        (
            ["--max-replicas", "4"],
            {"autoscaling": {"minReplicas": 5}},
            "floor <= ceiling: autoscaling.minReplicas=5 in ",
        ),
        (
            [],
            {"autoscaling": {"enabled": True}},
            "autoscaling is on (autoscaling.enabled=true in ",
        ),
        (["--min-replicas", "2"], {}, "--min-replicas needs --max-replicas"),
        (["--no-build", "--mount-path", "/models"], {}, "is not under --mount-path /models"),
    ],
)
def test_gpu_deploy_refusals_name_the_value_and_the_fix(gpu_repo, tmp_path, args, cluster, message):
    repo = hub_variant(gpu_repo, tmp_path)
    files = ["-f", write_values(tmp_path / "c.yaml", cluster)] if cluster else []
    result = invoke("deploy", "--repo", repo, "-o", tmp_path / "d", "--image", IMAGE, *files, *args)
    assert result.exit_code == 1 and message in result.output and "fix:" in result.output, (
        result.output
    )


def test_local_checkpoint_needs_no_build_on_the_volume(helm, gpu_repo, tmp_path):
    result = invoke("deploy", "--repo", gpu_repo, "-o", tmp_path / "d", "--image", IMAGE)
    assert (
        result.exit_code == 1
        and "cluster's build Job cannot reach" in result.output
        and "--no-build" in result.output
    )
    volume = gpu_repo.parent
    values = deploy(gpu_repo, tmp_path / "d", "--no-build", "--mount-path", volume)
    assert values["build"] == {"enabled": False, "args": []} and values["model"][
        "repositoryPath"
    ] == str(gpu_repo)
    docs = render(helm, tmp_path / "d")
    assert validation_errors(docs) == [] and not [d for d in docs if d["kind"] == "Job"]
    triton = container(server_deployment(docs)["spec"]["template"]["spec"], "triton")
    assert flag(triton["args"], "--repo") == str(gpu_repo)


def test_modified_repository_is_refused(cpu_repo, tmp_path):
    copy = tmp_path / "volume" / "repo"
    shutil.copytree(cpu_repo, copy)
    (copy / "postprocessing" / "1" / "model.py").write_text("# edited\n")
    result = invoke("deploy", "--repo", copy, "-o", tmp_path / "d", "--image", IMAGE)
    assert result.exit_code == 1 and "postprocessing/1/model.py (modified)" in result.output


def test_output_folder_rules(cpu_repo, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    result = invoke("deploy", "--repo", cpu_repo, "-o", foreign, "--image", IMAGE)
    assert result.exit_code == 1 and "was not written by toolkit deploy" in result.output
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    out = tmp_path / "d"
    first = deploy(cpu_repo, out)
    (out / "chart" / "stale.yaml").write_text("left over")
    second = deploy(cpu_repo, out, "--replicas", "3")
    assert (
        second["replicas"] == 3
        and first["replicas"] == 1
        and not (out / "chart" / "stale.yaml").exists()
    )
    assert not list(tmp_path.glob(".d.*-*"))  # no staging or retired folder left behind
    record = json.loads((out / "deploy.json").read_text())
    assert record["fingerprint"] == second["model"]["fingerprint"] and record["commands"][
        -1
    ].startswith("helm upgrade --install")


def test_dry_run_writes_nothing(cpu_repo, tmp_path):
    result = invoke(
        "deploy", "--repo", cpu_repo, "-o", tmp_path / "d", "--image", IMAGE, "--dry-run", "--json"
    )
    assert result.exit_code == 0 and not (tmp_path / "d").exists()
    assert json.loads(result.stdout)["values"]["model"]["target"] == "cpu"


def test_no_image_is_refused(cpu_repo, tmp_path):
    result = invoke("deploy", "--repo", cpu_repo, "-o", tmp_path / "d")
    assert (
        result.exit_code == 1 and "no toolkit image" in result.output and "--image" in result.output
    )


def test_every_gpu_profile_has_a_node_label():
    assert all(profile.gpu_products for profile in GPU_PROFILES.values())


# --- the fingerprint and the init container's wait -----------------------------------------------
def test_fingerprint_ignores_where_a_repository_is_but_not_what_it_serves(cpu_repo, tmp_path):
    manifest = open_repository(cpu_repo).manifest
    moved = tmp_path / "elsewhere"
    shutil.copytree(cpu_repo, moved)
    assert fingerprint(open_repository(moved).manifest) == fingerprint(manifest)
    data = manifest.to_dict()
    data["limits"]["max_output_len"] += 1
    changed = type(manifest).from_dict(data, cpu_repo / "manifest.json")
    assert fingerprint(changed) != fingerprint(manifest)
    gpu = json.loads(json.dumps(manifest.to_dict()))
    gpu["engine"] = {"kind": "tensorrtllm", "world_size": 2, "parameters": {"engine_dir": "/a"}}
    elsewhere = {**gpu, "engine": {**gpu["engine"], "parameters": {"engine_dir": "/b"}}}
    read = lambda d: type(manifest).from_dict(d, cpu_repo / "manifest.json")  # noqa: E731
    assert fingerprint(read(gpu)) == fingerprint(read(elsewhere))
    plan = plan_memory(
        facts_from_config(json.loads(LLAMA_8B.read_text())),
        get_gpu("h100-sxm"),
        model="llama-3.1-8b-instruct",
    ).to_dict()
    planned = {**gpu, "memory_plan": plan}
    renamed = {**planned, "memory_plan": {**plan, "model": "Llama-3.1-8B-Instruct"}}
    assert fingerprint(read(planned)) == fingerprint(read(renamed))  # a display name serves nothing
    bigger = {**planned, "memory_plan": {**plan, "kv_cache_tokens": plan["kv_cache_tokens"] + 64}}
    assert fingerprint(read(planned)) != fingerprint(read(bigger))


def test_wait_accepts_only_the_deployed_repository(cpu_repo, tmp_path):
    expected = fingerprint(open_repository(cpu_repo).manifest)
    assert check_repository_for(tmp_path / "absent", expected) is None
    assert check_repository_for(cpu_repo, expected).path == cpu_repo
    with pytest.raises(DeployError, match="not the one deployed"):
        check_repository_for(cpu_repo, "0" * 16)
    with pytest.raises(DeployError, match="no repository at .* after 0s"):
        wait_for_repository(tmp_path / "absent", expected, 0.3, poll_s=0.1)
    copy = tmp_path / "copy"
    shutil.copytree(cpu_repo, copy)
    (copy / "preprocessing" / "config.pbtxt").write_text("name: 'x'\n")
    with pytest.raises(RepositoryError, match="differs from what toolkit build wrote"):
        check_repository_for(copy, expected)
    # What the pods run: a hidden toolkit command, with the CLI's errors and exit codes.
    result = invoke("wait-for-repository", "--repo", cpu_repo, "--fingerprint", expected)
    assert result.exit_code == 0 and f"fingerprint {expected}" in result.output, result.output
    result = invoke(
        "wait-for-repository", "--repo", copy, "--fingerprint", expected, "--timeout", "0"
    )
    assert result.exit_code == 1 and "differs from what toolkit build wrote" in result.output
    assert (
        "fix: rebuild it" in result.output and "remove that folder from the volume" in result.output
    )
    assert "wait-for-repository" not in invoke("--help").output  # the pods' command, not a user's


def test_wait_refuses_a_repository_another_toolkit_built(cpu_repo, tmp_path):
    """The fingerprint matches what toolkit deploy rendered, but the image's toolkit is another one."""
    copy = tmp_path / "copy"
    shutil.copytree(cpu_repo, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["toolkit_version"] = "0.0.9"
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2))
    expected = fingerprint(open_repository(copy).manifest)
    result = invoke("wait-for-repository", "--repo", copy, "--fingerprint", expected)
    assert result.exit_code == 1 and "was built by toolkit 0.0.9" in result.output, result.output


def rule_selectors(docs: list[dict]) -> list[tuple[str, str, dict]]:
    """(where, metric, labels) of every metric selector a rendered autoscaler or routing rule uses."""
    found = []
    for trigger in find(docs, "ScaledObject")["spec"]["triggers"]:
        for metric, labels in promql_selectors(trigger["metadata"]["query"]):
            found.append((f"ScaledObject trigger {trigger['name']}", metric, labels))
    for key, spec in engine_specs(epp_config(docs)).items():
        if spec:
            found.append((f"EPP {key}", *spec_selector(spec)))
    return found


def test_rule_metrics_are_the_tensorrt_llm_backends_own_names(gpu_render):
    """Against the independent record of the backend at the pinned revision (tests/data/upstream)."""
    record = json.loads((DATA / "upstream" / "triton_backend.json").read_text())["revisions"][
        "c2e65b8"
    ]["metrics"]
    selectors = rule_selectors(gpu_render[2])
    assert {m for _, m, _ in selectors} == {
        "nv_trt_llm_request_metrics",
        "nv_trt_llm_kv_cache_block_metrics",
        "toolkit_api_requests_in_flight",
    }
    api = {
        sample.name: (family.type, set(family.samples[0].labels) if family.samples else set())
        for family in ApiMetrics().registry.collect()
        for sample in family.samples
    }
    for where, metric, labels in selectors:
        exporter = {k: v for k, v in labels.items() if k not in TARGET_LABELS}
        if metric.startswith(
            "toolkit_api_"
        ):  # the API's own gauge, scraped through the `http` endpoint
            assert metric in api and api[metric][0] == "gauge", where
            assert set(exporter) <= api[metric][1], where
            continue
        family = record["families"][metric]
        assert family["kind"] == "gauge", where
        assert exporter.pop(family["category"]) in record["vectors"][family["labels"]], where
        assert set(exporter) <= set(record["labels_on_every_metric"]), where


def test_the_build_job_sets_every_build_setting_the_manifest_records(gpu_render):
    """Each setting the build resolved (recipe-only ones included: scheduler policy, KV reuse, free
    memory share) reaches the build Job as its own flag, so the Job plans the same engine."""
    from toolkit.cli.options import pop_settings

    repo, _, docs, _ = gpu_render
    params = dict(build_command.make_context("build", list(build_container(docs)["args"])).params)
    given = pop_settings(params).given()
    recorded = open_repository(repo).manifest.settings.given()
    recorded.pop("engine_dir")  # the Job passes its own --engine-dir on the volume
    given.pop("engine_dir", None)
    assert given == recorded
    assert {
        "batch_scheduler_policy",
        "kv_cache_free_gpu_mem_fraction",
        "enable_kv_cache_reuse",
    } <= set(given)


def test_cluster_values_hold_unless_a_flag_is_given(cpu_repo, tmp_path):
    cluster = {
        "replicas": 3,
        "routing": {"mode": "service", "gateway": {"name": "edge"}},
        "storage": {"mountPath": "/data", "storageClassName": "nfs-rwx"},
        "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 5},
        "api": {"auth": {"existingSecret": "team-keys"}},
    }
    path = write_values(tmp_path / "cluster.yaml", cluster)
    args = ["--repo", cpu_repo, "-o", tmp_path / "d", "--image", IMAGE, "-f", path]
    result = invoke("deploy", *args, "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    # The file's fixed count is not what runs while autoscaling is on: said, not silently dropped.
    assert any(f"replicas=3 in {path} is not used" in n for n in json.loads(result.stdout)["notes"])
    values = json.loads(result.stdout)["values"]
    assert (values["routing"]["mode"], values["storage"]["mountPath"]) == ("service", "/data")
    assert values["autoscaling"]["minReplicas"] == 2 and values["autoscaling"]["maxReplicas"] == 5
    assert (
        values["api"]["auth"]["existingSecret"] == "team-keys"
        and values["routing"]["gateway"]["name"] == "edge"
    )
    flags = ["--min-replicas", "4", "--routing", "inference-pool", "--max-replicas", "6"]
    values = deploy(cpu_repo, tmp_path / "d", "-f", path, *flags, "--mount-path", "/models")
    assert (values["routing"]["mode"], values["storage"]["mountPath"]) == (
        "inferencePool",
        "/models",
    )
    assert values["autoscaling"]["minReplicas"] == 4 and values["autoscaling"]["maxReplicas"] == 6
    write_values(path, {**cluster, "build": {"enabled": False}})
    result = invoke(
        "deploy", "--repo", cpu_repo, "-o", tmp_path / "d", "--image", IMAGE, "-f", path
    )
    assert (
        result.exit_code == 1
        and "sets `build.enabled`" in result.output
        and "--no-build" in result.output
    )


def test_replicas_has_no_short_option_that_reads_as_a_namespace(cpu_repo, tmp_path):
    """kubectl and helm read -n as --namespace: `toolkit deploy -n llm` must not mean 'llm replicas'."""
    result = invoke("deploy", "--repo", cpu_repo, "-o", tmp_path / "d", "--image", IMAGE, "-n", "2")
    assert result.exit_code == 1 and "No such option '-n'" in result.output


@pytest.mark.parametrize("apis", [CRD_APIS, ("monitoring.coreos.com/v1/PodMonitor",)])
def test_install_notes_render(helm, cpu_repo, tmp_path, apis):
    """`helm template` leaves NOTES.txt out; render it as a named template of a copy of the chart."""
    deploy(cpu_repo, tmp_path / "d", *(["--max-replicas", "3"] if len(apis) > 1 else []))
    templates = tmp_path / "d" / "chart" / "templates"
    notes = (templates / "NOTES.txt").read_text()
    (templates / "_notes_check.tpl").write_text(
        '{{- define "notes-check" -}}\n' + notes + "\n{{- end -}}\n"
    )
    (templates / "notes-check.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: |\n"
        '{{ include "notes-check" . | indent 4 }}\n'
    )
    docs = render(helm, tmp_path / "d", apis=apis)
    text = find(docs, "ConfigMap", "notes")["data"]["notes"]
    deadline = server_deployment(docs)["spec"]["progressDeadlineSeconds"]
    assert f"rollout status deployment/{RELEASE} --timeout={deadline}s" in text
    if len(apis) > 1:
        assert f"InferencePool {RELEASE}" in text and "KEDA scales 1..3 replicas" in text
    else:
        assert "no prefix-cache or queue-aware routing" in text


def test_load_and_drain_times_come_from_the_engine_files_and_the_plan(gpu_render):
    repo, values, _, _ = gpu_render
    repository = open_repository(repo)
    engine = Path(repository.manifest.engine.parameters["engine_dir"])
    loaded = sum(
        (engine / f"rank{r}.engine").stat().st_size for r in range(2)
    )  # bytes a replica reads
    hashed = sum(size for size, _, _ in repository.manifest.files.values())  # bytes it checks
    assert (
        values["startup"]["timeoutSeconds"]
        == math.ceil((180 + hashed / 1e9 + loaded / 200e6) / 10) * 10
    )
    plan, limits = repository.memory_plan, repository.limits
    stream = limits.max_output_len * plan.decode_step_ms_at_max_batch / 1000 * 2
    # Up to max_queue_size admitted requests wait for a batch slot, max_batch_size at a time.
    queued = math.ceil(limits.max_queue_size / limits.max_batch_size) * stream
    longest = math.ceil(queued + stream)
    assert values["drain"]["timeoutSeconds"] == min(900, max(30, longest))
    assert gateway_seconds(values["routing"]["httpRoute"]["requestTimeout"]) == (
        max(300, values["drain"]["timeoutSeconds"], longest)
    )
    assert values["api"]["maxInFlight"] == limits.max_batch_size + limits.max_queue_size


def test_the_cpu_drain_and_route_cover_the_queue_before_the_first_token(cpu_repo, tmp_path):
    """The API admits max_batch_size + max_queue_size requests: the last one admitted waits for
    max_queue_size / max_batch_size streams before its own (10 tokens/s per CPU stream)."""
    limits = open_repository(cpu_repo).limits
    stream = limits.max_output_len / 10
    longest = math.ceil(math.ceil(limits.max_queue_size / limits.max_batch_size) * stream + stream)
    assert longest > 30  # more than the stream alone would give
    values = deploy(cpu_repo, tmp_path / "d")
    assert values["drain"]["timeoutSeconds"] == min(900, longest)
    assert gateway_seconds(values["routing"]["httpRoute"]["requestTimeout"]) == max(300, longest)


def test_route_timeout_and_scaling_follow_the_load_and_drain_times_given(cpu_repo, tmp_path):
    cluster = write_values(tmp_path / "c.yaml", {"drain": {"preStopSeconds": 10}})
    args = [
        "--startup-timeout",
        "1200",
        "--drain-timeout",
        "500",
        "--max-replicas",
        "4",
        "-f",
        cluster,
    ]
    values = deploy(cpu_repo, tmp_path / "d", *args)
    assert values["routing"]["httpRoute"]["requestTimeout"] == "8m20s"
    scaling = values["autoscaling"]
    assert scaling["scaleUp"]["periodSeconds"] == 1200  # one load time per step up
    assert scaling["scaleDown"]["stabilizationWindowSeconds"] == 2400  # two load times
    assert (
        scaling["scaleDown"]["periodSeconds"] == 10 + 500 + 15
    )  # one grace period per replica down


def test_the_documented_cluster_values_deploy_the_h100_repository(helm, gpu_render, tmp_path):
    """The example in docs/deploy.md ("Cluster values") is a working values file: its image too
    (no --image here), with the tag toolkit deploy derives from the engines' Triton container."""
    text = (Path(__file__).parents[1] / "docs" / "deploy.md").read_text()
    section = text[text.index("## Cluster values") :]
    example = section[
        section.index("```yaml\n") + 8 : section.index("```", section.index("```yaml\n") + 8)
    ]
    cluster = write_values(tmp_path / "cluster.yaml", yaml.safe_load(example))
    out = tmp_path / "d"
    result = invoke(
        "deploy", "--repo", gpu_render[0], "-o", out, "-f", cluster, "--max-replicas", "4"
    )
    assert result.exit_code == 0, result.output
    values = yaml.safe_load((out / "values.yaml").read_text())
    assert values["gpu"]["products"] == ["NVIDIA-H100-80GB-HBM3"]
    assert values["image"] == {
        "repository": "registry.example.com/ml/toolkit",
        "tag": "0.1.0-25.06-trtllm-python-py3",
    }
    docs = render(helm, out)
    assert validation_errors(docs) == []
    route = find(docs, "HTTPRoute")["spec"]["parentRefs"][0]
    assert (route["name"], route["namespace"]) == ("inference-gateway", "gateway-system")
    assert find(docs, "PersistentVolumeClaim")["spec"]["storageClassName"] == "filestore-rwx"
    triton = container(server_deployment(docs)["spec"]["template"]["spec"], "triton")
    assert triton["image"] == "registry.example.com/ml/toolkit:0.1.0-25.06-trtllm-python-py3"


# --- what the reviewer found: each fix, checked on the render -----------------------------------
def test_a_repository_another_toolkit_built_is_refused(cpu_repo, gpu_repo, tmp_path):
    """The pods run this toolkit's image and the build Job rebuilds with it: a repository of another
    toolkit release (or other model sources) would only fail there, after a full build."""
    cpu = tmp_path / "cpu"
    shutil.copytree(cpu_repo, cpu)
    manifest = json.loads((cpu / "manifest.json").read_text())
    manifest["toolkit_version"] = "0.0.9"
    (cpu / "manifest.json").write_text(json.dumps(manifest, indent=2))
    result = invoke("deploy", "--repo", cpu, "-o", tmp_path / "d", "--image", IMAGE)
    assert result.exit_code == 1 and "was built by toolkit 0.0.9" in result.output, result.output
    assert "fix: rebuild it with this toolkit" in result.output and not (tmp_path / "d").exists()
    gpu = hub_variant(gpu_repo, tmp_path)  # GPU targets too, not only the Python engines
    manifest = json.loads((gpu / "manifest.json").read_text())
    manifest["sources_digest"] = "0" * 16
    (gpu / "manifest.json").write_text(json.dumps(manifest, indent=2))
    result = invoke("deploy", "--repo", gpu, "-o", tmp_path / "d", "--image", IMAGE)
    assert result.exit_code == 1 and f"(model sources {'0' * 16})" in result.output, result.output


def test_the_gateway_route_publishes_the_openai_api_only(helm, cpu_repo, tmp_path):
    """/metrics and /health of the API answer without a key: the gateway must not publish them."""
    deploy(cpu_repo, tmp_path / "d")
    for apis in (
        CRD_APIS,
        ("monitoring.coreos.com/v1/PodMonitor", "gateway.networking.k8s.io/v1/HTTPRoute"),
    ):
        rules = find(render(helm, tmp_path / "d", apis=apis), "HTTPRoute")["spec"]["rules"]
        assert [m["path"] for r in rules for m in r["matches"]] == [
            {"type": "PathPrefix", "value": "/v1"}
        ]


def test_triton_http_and_grpc_stay_on_loopback(gpu_render):
    """Triton checks no API key: only its metrics port is on the pod IP (endpoint picker, Prometheus)."""
    pod = server_deployment(gpu_render[2])["spec"]["template"]["spec"]
    triton, api = container(pod, "triton"), container(pod, "api")
    argv = triton["command"] + triton["args"]
    assert "--expose-triton" not in argv
    assert (flag(triton["args"], "--host"), flag(triton["args"], "--metrics-host")) == (
        "127.0.0.1",
        "0.0.0.0",
    )
    assert [p["name"] for p in triton["ports"]] == ["metrics"]
    assert flag(triton["args"], "--metrics-port") == str(triton["ports"][0]["containerPort"])
    assert flag(api["args"], "--triton-url") == f"127.0.0.1:{flag(triton['args'], '--grpc-port')}"
    assert all("exec" in triton[k] for k in ("startupProbe", "readinessProbe", "livenessProbe"))
    # Triton's log: a file toolkit serve can read back (not /dev/stdout), shown on stdout by tail.
    log = flag(triton["args"], "--log-file")
    assert (
        log.startswith("/var/cache/toolkit/")
        and {"name": "TRITON_LOG", "value": log} in triton["env"]
    )


def test_containers_without_gpus_see_none(gpu_render):
    """NVIDIA's images default NVIDIA_VISIBLE_DEVICES=all: without a GPU request a container would see every GPU."""
    pod = server_deployment(gpu_render[2])["spec"]["template"]["spec"]
    for c in pod["initContainers"] + pod["containers"]:
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        if "nvidia.com/gpu" in c.get("resources", {}).get("limits", {}):
            assert "NVIDIA_VISIBLE_DEVICES" not in env, c["name"]
        else:
            assert env.get("NVIDIA_VISIBLE_DEVICES") == "void", c["name"]


def test_build_job_requests_host_memory_for_the_checkpoint(gpu_render, cpu_repo, tmp_path):
    """Quantizing an 8B model holds its bf16 checkpoint (16 GB) in host memory, and the converted one."""
    repo, values, docs, _ = gpu_render
    build = build_container(docs)["resources"]
    parameters = open_repository(repo).memory_plan.parameter_count
    memory = int(build["requests"]["memory"].removesuffix("Gi"))
    assert memory == math.ceil((8 * 2**30 + 2 * 2 * parameters + 2 * 2**30) / 2**30)
    assert 30 <= memory <= 64  # tens of GB for 8B parameters
    assert int(build["requests"]["cpu"]) >= 4 and "memory" not in build["limits"]
    assert build["limits"] == {"nvidia.com/gpu": 2}
    cpu = deploy(cpu_repo, tmp_path / "d")["build"]["resources"]["requests"]
    assert set(cpu) == {"cpu", "memory"}


RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_errors(where: str, spec: dict) -> list[str]:
    """Pod Security Standards, "restricted" profile (kubernetes.io/docs/concepts/security/pod-security-standards)."""
    errors, pod = [], spec.get("securityContext", {})
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            errors.append(f"{where}: volume {volume['name']} is {kinds}")
    for c in spec.get("initContainers", []) + spec["containers"]:
        sc, name = c.get("securityContext", {}), f"{where}/{c['name']}"
        if not sc.get("runAsNonRoot", pod.get("runAsNonRoot")):
            errors.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser", pod.get("runAsUser")) == 0:
            errors.append(f"{name}: runAsUser 0")
        if sc.get("seccompProfile", pod.get("seccompProfile", {})).get("type") not in (
            "RuntimeDefault",
            "Localhost",
        ):
            errors.append(f"{name}: no RuntimeDefault seccomp profile")
        if sc.get("allowPrivilegeEscalation") is not False:
            errors.append(f"{name}: allowPrivilegeEscalation is not false")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            errors.append(f"{name}: capabilities do not drop ALL")
    return errors


def test_every_pod_meets_the_restricted_pod_security_standard(gpu_render):
    docs = gpu_render[2]
    errors = [
        e
        for where, template in pod_templates(docs)
        for e in restricted_errors(where, template["spec"])
    ]
    assert errors == []
    pod = server_deployment(docs)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["fsGroup"] == 1000
    keys = {v["name"]: v for v in pod["volumes"]}["api-keys"]["secret"]
    assert keys["defaultMode"] == 0o440  # group-readable: the fsGroup's, the containers' group
    for dockerfile in ("Dockerfile.gpu", "Dockerfile.cpu"):  # the images run as that user
        text = (Path(__file__).parents[1] / "deploy" / "image" / dockerfile).read_text()
        assert text.rstrip().splitlines()[-1] == "USER 1000:1000", dockerfile


def test_replicas_spread_over_nodes(gpu_render):
    template = server_deployment(gpu_render[2])["spec"]["template"]
    (spread,) = template["spec"]["topologySpreadConstraints"]
    assert (
        spread["topologyKey"] == "kubernetes.io/hostname"
        and spread["whenUnsatisfiable"] == "ScheduleAnyway"
    )
    assert matches(spread["labelSelector"]["matchLabels"], template["metadata"]["labels"])


def test_autoscaling_scales_on_the_apis_requests_in_flight_and_on_queueing(
    helm, gpu_render, cpu_repo, tmp_path
):
    """The TensorRT-LLM backend's `active` is capped at max_batch_size (the executor's max active
    requests) and `waiting` = active - scheduled: requests queued beyond the batch slots show in
    neither, so a trigger on scheduled + waiting never exceeds max_batch_size. The load signal is the
    API's own gauge of admitted requests; the saturation signal is those the engine is not running."""
    repo, values, docs, _ = gpu_render
    triggers = {t["name"]: t for t in find(docs, "ScaledObject")["spec"]["triggers"]}
    assert set(triggers) == {"requests-in-flight", "waiting-requests", "kv-cache-use"}
    load = triggers["requests-in-flight"]["metadata"]
    assert [m for m, _ in promql_selectors(load["query"])] == ["toolkit_api_requests_in_flight"]
    batch = open_repository(repo).limits.max_batch_size
    default = max(
        1, int(batch * 0.8)
    )  # scale-up starts (+10 % HPA tolerance) before a request queues
    assert load["threshold"] == str(default) == str(values["autoscaling"]["concurrencyPerReplica"])
    queued = triggers["waiting-requests"]["metadata"]["query"]
    assert [(m, labels.get("request_type")) for m, labels in promql_selectors(queued)] == [
        ("toolkit_api_requests_in_flight", None),
        ("nv_trt_llm_request_metrics", "scheduled"),
    ]
    assert 'request_type="waiting"' not in json.dumps(find(docs, "ScaledObject"))
    deploy(cpu_repo, tmp_path / "d", "--max-replicas", "4", "--concurrency-per-replica", "6")
    scaled = find(render(helm, tmp_path / "d"), "ScaledObject")["spec"]["triggers"]
    assert (
        next(t for t in scaled if t["name"] == "requests-in-flight")["metadata"]["threshold"] == "6"
    )


def test_the_triggers_see_requests_queued_beyond_the_batch_slots(gpu_render):
    """The rendered queries over what a GPU replica exports when its batch slots are full and 300
    more requests queue: the backend's gauges say `active` = scheduled = max_batch_size and `waiting`
    0; the API's gauge says max_batch_size + 300. A lightly loaded replica must not hide the queue."""
    repo, _, docs, _ = gpu_render
    batch = open_repository(repo).limits.max_batch_size
    monitor = find(docs, "PodMonitor")
    namespace, job = monitor["metadata"]["namespace"], f"{NAMESPACE}/{monitor['metadata']['name']}"
    series = []
    for pod, in_flight, scheduled in (
        ("a", batch + 300, batch),
        ("b", 3, 5),
    ):  # b: streams just ended in the API
        target = {"namespace": namespace, "job": job, "pod": pod}
        series.append(("toolkit_api_requests_in_flight", {**target, "container": "api"}, in_flight))
        for kind, value in (("active", scheduled), ("scheduled", scheduled), ("waiting", 0)):
            labels = {**target, "model": "tensorrt_llm", "version": "1", "request_type": kind}
            series.append(("nv_trt_llm_request_metrics", {**labels, "container": "triton"}, value))
    triggers = {t["name"]: t["metadata"] for t in find(docs, "ScaledObject")["spec"]["triggers"]}
    assert promql_value(triggers["requests-in-flight"]["query"], series) == batch + 303
    assert promql_value(triggers["waiting-requests"]["query"], series) == 300
    assert (
        promql_value(triggers["waiting-requests"]["query"], series[:0]) is None
    )  # no series: fallback


def test_a_pipeline_parallel_replica_is_not_taken_for_a_queued_one(helm, gpu_render, tmp_path):
    """With pp stages the engine runs max_batch_size x pp requests (one micro-batch per stage) and
    reports `scheduled` for the last micro-batch only: a replica running 2 x B requests and queueing
    none must read 0 queued, and the default target must count every stage's slots."""
    repo, values, _, _ = gpu_render
    batch = open_repository(repo).limits.max_batch_size
    out = tmp_path / "d"
    deploy(repo, out, "--min-replicas", "2", "--max-replicas", "8")
    docs = render(helm, out, extra=("--set", "model.pipelineStages=2"))
    monitor = find(docs, "PodMonitor")
    target = {
        "namespace": monitor["metadata"]["namespace"],
        "job": f"{NAMESPACE}/{monitor['metadata']['name']}",
        "pod": "a",
    }
    series = [("toolkit_api_requests_in_flight", {**target, "container": "api"}, 2 * batch)]
    labels = {**target, "model": "tensorrt_llm", "version": "1", "container": "triton"}
    series.append(("nv_trt_llm_request_metrics", {**labels, "request_type": "scheduled"}, batch))
    triggers = {t["name"]: t["metadata"] for t in find(docs, "ScaledObject")["spec"]["triggers"]}
    assert promql_value(triggers["waiting-requests"]["query"], series) == 0
    series[0] = (*series[0][:2], 2 * batch + 7)
    assert promql_value(triggers["waiting-requests"]["query"], series) == 7
    from toolkit.deploy import sizing

    repository = open_repository(repo)
    assert sizing.concurrency_per_replica(repository, 2) == int(2 * batch * sizing.SLOTS_TARGET)
    assert values["model"]["pipelineStages"] == 1  # this engine: TP 2, PP 1


def test_the_init_container_shares_the_cache_with_the_servers(gpu_render):
    """Its file-hash memos (keyed by inode and ctime) must reach toolkit serve, or serve hashes the
    whole repository again inside the startup budget."""
    pod = server_deployment(gpu_render[2])["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["command"] == ["toolkit", "wait-for-repository"]

    def cache(c: dict) -> tuple:
        home = next(e["value"] for e in c["env"] if e["name"] == "TOOLKIT_HOME")
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == home)
        return home, mount["name"], mount.get("readOnly", False)

    assert cache(init) == cache(container(pod, "triton")) == ("/var/cache/toolkit", "cache", False)
    assert {v["name"]: v for v in pod["volumes"]}["cache"] == {"name": "cache", "emptyDir": {}}


def test_k8s_tools_installer_fails_clearly_where_its_binaries_do_not_run(tmp_path):
    """The pinned helm and kubectl are linux/x86_64 builds: elsewhere the installer fails (as the deploy
    tests do without helm), naming what to install, instead of exiting 0 with nothing installed."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "uname").write_text('#!/bin/sh\n[ "$1" = -m ] && echo aarch64 || echo Linux\n')
    (fake / "uname").chmod(0o755)
    script = Path(__file__).parents[1] / "scripts" / "install_k8s_tools.sh"
    env = {"PATH": f"{fake}:/usr/bin:/bin"}
    result = subprocess.run(
        ["bash", script, tmp_path / "bin"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 1, result.stderr
    assert (
        "error:" in result.stderr and "aarch64" in result.stderr and "helm v3.17.3" in result.stderr
    )


# --- second review: GPU autoscaling, the build's order, probes, values helm refuses, /dev/shm -----
class _FakeFamily:
    """pb_utils.MetricFamily, enough to read what the engines' metrics set."""

    GAUGE, COUNTER, HISTOGRAM = "gauge", "counter", "histogram"

    def __init__(self, name: str, description: str, kind: str):
        self.name = name

    def Metric(self, labels: dict, buckets=None):  # noqa: N802 - pb_utils' name
        return _FakeMetric()


class _FakeMetric:
    value = None

    def set(self, value) -> None:
        self.value = value

    def observe(self, value) -> None:
        pass


def test_the_python_engines_report_requests_as_the_tensorrt_llm_backend_does():
    """The backend's `active` is what the executor holds in its batch (at most max_batch_size, its max
    active requests); requests beyond wait in the executor's queue, which Triton does not export, and
    `waiting` = active - scheduled counts only active requests not scheduled (KV blocks, token budget).
    The CPU and synthetic engines report the same, so the live tests see what a GPU replica shows."""
    import types

    from toolkit.repository.sources import model_repo_sources

    sys.path.insert(0, str(model_repo_sources() / "common"))
    from engine_metrics import EngineMetrics

    pb_utils = types.SimpleNamespace(MetricFamily=_FakeFamily)
    metrics = EngineMetrics(
        pb_utils,
        model="tensorrt_llm",
        version="1",
        max_batch_size=2,
        kv_blocks=16,
        tokens_per_block=8,
    )

    def requests() -> dict:
        return {
            label: gauge.value
            for (family, label), gauge in metrics.gauges.items()
            if family == "nv_trt_llm_request_metrics"
        }

    # Six requests held: both slots run, four queue for a slot.
    metrics.update(held=6, scheduled=2, context=0, used_blocks=4, context_tokens=0)
    assert requests() == {"active": 2, "max": 2, "scheduled": 2, "context": 0, "waiting": 0}
    # Both slots taken, one of them not scheduled this step (no KV block for it): the backend's waiting.
    metrics.update(held=3, scheduled=1, context=0, used_blocks=16, context_tokens=0)
    assert requests() == {"active": 2, "max": 2, "scheduled": 1, "context": 0, "waiting": 1}


def test_the_build_runs_before_the_replicas_exist(gpu_render, tmp_path):
    """Replicas hold their GPUs while their init container waits for the repository; a build Job that
    needs GPUs of the same kind, applied beside them, never schedules on a full cluster. The Job is a
    pre-install/pre-upgrade hook: helm applies the Deployment only after it succeeded (and not at all
    when it fails). Its claim is created before it; helm waits for the build as long as its deadline."""
    repo, values, docs, _ = gpu_render
    job = find(docs, "Job")
    hooks = job["metadata"]["annotations"]
    assert hooks["helm.sh/hook"] == "pre-install,pre-upgrade"
    # The last try's Job (and its log) stays until the next one replaces it.
    assert hooks["helm.sh/hook-delete-policy"] == "before-hook-creation"
    # One Job per fingerprint: a Job's pod template is immutable, so another build needs another name.
    assert job["metadata"]["name"] == f"{RELEASE}-build-{values['model']['fingerprint'][:8]}"
    assert (
        job["metadata"]["annotations"]["toolkit/repository-location"]
        == (server_deployment(docs)["metadata"]["annotations"]["toolkit/repository-location"])
    )
    claim = find(docs, "PersistentVolumeClaim")["metadata"]["annotations"]
    assert (
        claim["helm.sh/hook"] == "pre-install,pre-upgrade"
        and "helm.sh/hook-delete-policy" not in claim
    )
    assert int(claim["helm.sh/hook-weight"]) < int(hooks["helm.sh/hook-weight"])
    assert claim["helm.sh/resource-policy"] == "keep"  # engines outlive the release
    others = [d for d in docs if d["kind"] not in ("Job", "PersistentVolumeClaim")]
    assert not [d for d in others if "helm.sh/hook" in d["metadata"].get("annotations", {})]
    # helm waits for a hook Job for --timeout (5 min by default): the printed install allows the
    # build's own deadline, so a failed build is reported with its reason, not helm's timeout.
    result = invoke(
        "deploy", "--repo", repo, "-o", tmp_path / "d", "--image", IMAGE, "--dry-run", "--json"
    )
    install = json.loads(result.stdout)["commands"][-1].split()
    assert install[:3] == ["helm", "upgrade", "--install"]
    assert gateway_seconds(flag(install, "--timeout")) > job["spec"]["activeDeadlineSeconds"]
    # toolkit itself is PID 1 of each container (a shell there ignores SIGTERM: the build would be
    # killed without cleaning its staging folder off the volume).
    spec = job["spec"]["template"]["spec"]
    (build,), (check,) = spec["initContainers"], spec["containers"]
    assert build["command"] == ["toolkit", "build"]
    assert check["command"] == ["toolkit", "wait-for-repository"]
    assert flag(check["args"], "--repo") == flag(build["args"], "--output")
    assert flag(check["args"], "--fingerprint") == values["model"]["fingerprint"]
    assert flag(check["args"], "--timeout") == "0"
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in check["env"]
    assert "nvidia.com/gpu" not in json.dumps(check.get("resources", {}))


def test_an_upgrade_that_keeps_the_fingerprint_builds_nothing(helm, cpu_repo, tmp_path):
    """A hook Job needs a free GPU even when it would only find the repository built: an upgrade that
    serves the same fingerprint (a new replica count, an image pull policy) skips it when the cluster
    shows it built: the release's Deployment serves it, or the last build Job of it succeeded. The
    decision reads `lookup` (empty under helm template); here it is given what the cluster holds."""
    values = deploy(cpu_repo, tmp_path / "d")

    def of(fingerprint: str, location: str = "$where", rerun: str = '""') -> str:
        """An object's metadata, annotated as the chart's objects are."""
        return (
            f'"metadata" (dict "annotations" (dict "toolkit/fingerprint" {fingerprint} '
            f'"toolkit/repository-location" {location} "toolkit/build-rerun" {rerun}))'
        )

    other = '"0"'
    claim = '"claim" (dict "kind" "PersistentVolumeClaim")'
    cases = {
        "fresh": "dict",
        "deployed": f'dict {claim} "deployment" (dict {of("$fp")})',
        "deployed-other": f'dict {claim} "deployment" (dict {of(other)})',
        "deployed-elsewhere": f'dict {claim} "deployment" (dict {of("$fp", location=other)})',
        "deployed-claim-gone": f'dict "deployment" (dict {of("$fp")})',  # a new, empty volume
        "built": f'dict {claim} "job" (dict {of("$fp")} "status" (dict "succeeded" 1))',
        "build-failed": f'dict {claim} "job" (dict {of("$fp")} "status" (dict "failed" 2))',
        "built-other": f'dict {claim} "job" (dict {of(other)} "status" (dict "succeeded" 1))',
    }
    lines = "\n".join(
        f'  {name}: {{{{ include "toolkit.buildNeeded" (merge (dict "root" $) ({found})) | quote }}}}'
        for name, found in cases.items()
    )
    (tmp_path / "d" / "chart" / "templates" / "build-needed-check.yaml").write_text(
        "{{- $fp := .Values.model.fingerprint }}\n"
        '{{- $where := include "toolkit.repositoryLocation" . }}\n'
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: build-needed}\ndata:\n" + lines + "\n"
    )
    data = find(render(helm, tmp_path / "d"), "ConfigMap", "build-needed")["data"]
    assert values["model"]["fingerprint"] and data == {
        "fresh": "true",
        "deployed": "",
        "deployed-other": "true",
        "deployed-elsewhere": "true",
        "deployed-claim-gone": "true",
        "built": "",
        "build-failed": "true",
        "built-other": "true",
    }
    # build.rerun: a value the last Job did not run with builds again, the same one does not.
    (tmp_path / "d" / "chart" / "templates" / "build-needed-check.yaml").write_text(
        "{{- $fp := .Values.model.fingerprint }}\n"
        '{{- $where := include "toolkit.repositoryLocation" . }}\n'
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: build-needed}\ndata:\n"
        f'  again: {{{{ include "toolkit.buildNeeded" (merge (dict "root" $) (dict {claim} '
        f'"deployment" (dict {of("$fp")}) "job" (dict {of("$fp", rerun=chr(34) + "7" + chr(34))} '
        '"status" (dict "succeeded" 1)))) | quote }}\n'
    )
    rerun = {"extra": ("--set", "build.rerun=7")}
    assert find(render(helm, tmp_path / "d", **rerun), "ConfigMap", "build-needed")["data"] == {
        "again": ""
    }
    rerun = {"extra": ("--set", "build.rerun=8")}
    assert find(render(helm, tmp_path / "d", **rerun), "ConfigMap", "build-needed")["data"] == {
        "again": "true"
    }


def gateway_seconds(duration: str) -> float:
    """Seconds of a Gateway API duration (GEP-2257: 1h2m3s, 500ms)."""
    parts = re.findall(r"([0-9]+)(h|ms|m|s)", duration)
    assert "".join(n + u for n, u in parts) == duration, duration
    unit = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(int(n) * unit[u] for n, u in parts)


def test_route_timeouts_are_gateway_api_durations(cpu_repo, tmp_path):
    """The HTTPRoute's timeout is written in hours, minutes and seconds: at most 5 digits each (the
    chart's schema and the Gateway API's CRD), so a long drain does not make helm refuse the values."""
    for drain, expected in ((86400, "24h"), (3725, "1h2m5s"), (500, "8m20s"), (301, "5m1s")):
        values = deploy(cpu_repo, tmp_path / "d", "--drain-timeout", str(drain))
        assert values["routing"]["httpRoute"]["requestTimeout"] == expected


@pytest.mark.parametrize(
    ("args", "cluster", "message", "fix"),
    [
        (["--mount-path", "models"], {}, "--mount-path models is not an absolute path", "--mount-path /models"),
        ([], {"storage": {"mountPath": "models"}}, "storage.mountPath=models in ", "--mount-path /models"),
        (["--drain-timeout", "100000"], {}, "--drain-timeout 100000 is more than", "--drain-timeout 86400"),
        (["--api-key-secret", "Bad_Name"], {}, "--api-key-secret Bad_Name is not a Secret name", "lowercase"),
        (["--hf-token-secret", "hf token"], {}, "--hf-token-secret 'hf token' is not a Secret name", "lowercase"),
        ([], {"routing": {"httpRoute": {"requestTimeout": "10min"}}}, "requestTimeout=10min in ", "1h30m"),
    ],
)  # fmt: skip
def test_values_helm_would_refuse_are_refused_first(
    cpu_repo, tmp_path, args, cluster, message, fix
):
    """What the chart's schema (or the API server) would refuse after `helm upgrade`: named here, with
    the flag or file that set it and the fix, before anything is written."""
    files = ["-f", write_values(tmp_path / "c.yaml", cluster)] if cluster else []
    result = invoke(
        "deploy", "--repo", cpu_repo, "-o", tmp_path / "d", "--image", IMAGE, *files, *args
    )
    assert result.exit_code == 1 and message in result.output, result.output
    assert "fix:" in result.output and fix in result.output, result.output
    assert not (tmp_path / "d").exists()


def test_memory_requests_count_the_shm_size_the_cluster_values_give(gpu_render, tmp_path):
    """/dev/shm is a memory emptyDir: its pages count against the container's memory limit. A cluster
    file that gives Triton (and the build Job) 16 GiB of it gets 14 GiB more memory than the default 2."""
    repo = gpu_render[0]
    default = deploy(repo, tmp_path / "a")
    cluster = write_values(tmp_path / "c.yaml", {"triton": {"shmSize": "16Gi"}})
    bigger = deploy(repo, tmp_path / "b", "-f", cluster)

    def gib(values: dict, key: str, kind: str = "requests") -> int:
        return int(values[key]["resources"][kind]["memory"].removesuffix("Gi"))

    assert gib(bigger, "triton") - gib(default, "triton") == 14
    assert gib(bigger, "triton", "limits") == gib(bigger, "triton")
    assert gib(bigger, "build") - gib(default, "build") == 14
    write_values(tmp_path / "c.yaml", {"triton": {"shmSize": "16GB"}})
    result = invoke("deploy", "--repo", repo, "-o", tmp_path / "e", "--image", IMAGE, "-f", cluster)
    assert result.exit_code == 1 and "triton.shmSize=16GB in " in result.output, result.output
    assert "fix:" in result.output and "16Gi" in result.output


def test_next_steps_create_the_secrets_in_the_release_namespace(cpu_repo, tmp_path):
    args = [
        "--repo",
        cpu_repo,
        "-o",
        tmp_path / "d",
        "--image",
        IMAGE,
        "--name",
        "llm",
        "--dry-run",
        "--json",
    ]
    result = invoke("deploy", *args, "--hf-token-secret", "hub-token")
    assert result.exit_code == 0, result.output
    commands = json.loads(result.stdout)["commands"]
    assert [c for c in commands if "secret" in c] == [
        "kubectl -n NAMESPACE create secret generic llm-api-keys --from-file=keys=./api-keys.txt",
        'kubectl -n NAMESPACE create secret generic hub-token --from-literal=token="$HF_TOKEN"',
    ]
    assert "--namespace NAMESPACE" in commands[-1]
    cluster = write_values(
        tmp_path / "c.yaml", {"build": {"hfToken": {"secretName": "hf", "key": "t"}}}
    )
    result = invoke("deploy", *args, "-f", cluster, "--no-auth")
    commands = json.loads(result.stdout)["commands"]
    assert [c for c in commands if "secret" in c] == [
        'kubectl -n NAMESPACE create secret generic hf --from-literal=t="$HF_TOKEN"'
    ]


def test_cluster_values_may_repeat_the_gpu_count_the_engines_need(gpu_render, tmp_path):
    """gpu.count is refused in cluster values only where it contradicts the repository (any GPU for a
    cpu or synthetic one, another count than the engine's ranks); docs/deploy.md says so."""
    repo = gpu_render[0]
    cluster = write_values(tmp_path / "c.yaml", {"gpu": {"count": 2}})
    assert deploy(repo, tmp_path / "d", "-f", cluster)["gpu"]["count"] == 2
    text = (Path(__file__).parents[1] / "docs" / "deploy.md").read_text()
    section = text[text.index("## Cluster values") :]
    assert "`gpu.count`) are refused" not in section
    assert "`gpu.count` only where it contradicts" in " ".join(section.split())
    # Triton's metrics server binds IPv4 or IPv6, never both on one socket: the doc says which.
    assert "IPv4" in text and "0.0.0.0" in text


def test_the_init_containers_wait_ends_at_once_on_sigterm(tmp_path):
    """A pod deleted while its init container waits for the repository (PID 1 there: the toolkit
    entry point's handler makes SIGTERM end it) must not sit out its grace period."""
    import signal
    import time

    argv = [str(Path(sys.executable).parent / "toolkit"), "wait-for-repository"]
    argv += ["--repo", str(tmp_path / "absent"), "--fingerprint", "0" * 16, "--timeout", "600"]
    process = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    try:
        assert "waiting for the repository" in process.stderr.readline()
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, stderr = process.communicate(timeout=10)
    finally:
        process.kill()
    assert time.monotonic() - sent < 3
    assert process.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in stderr, stderr
