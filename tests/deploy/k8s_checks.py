"""What a cluster would refuse in a render, checked offline: built-in kinds with kubernetes-validate
(strict, against the chart's floor and the newest Kubernetes it knows), custom resources and the
endpoint picker's config against the schemas transcribed into tests/data/k8s/ (each file names its
source and tag), plus the API server's and the controllers' cross-object rules (selectors match,
named ports exist, KEDA's webhook, the EPP's flags and RBAC) and the restricted Pod Security Standard.
"""

from __future__ import annotations

import json
import re

import jsonschema
import kubernetes_validate
import referencing
from kubernetes_validate.utils import SchemaNotFoundError
from kubernetes_validate.utils import ValidationError as KubeValidationError

from chart import (
    K8S,
    KUBE_VERSIONS,
    RELEASE,
    engine_specs,
    epp_config,
    find,
    flag,
    matches,
    pod_templates,
    server_deployment,
)
from promql import METRIC_SPEC, promql_selectors, spec_selector

CRD_SCHEMAS = {
    (
        "inference.networking.k8s.io/v1",
        "InferencePool",
    ): "inferencepool.inference.networking.k8s.io_v1",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute.gateway.networking.k8s.io_v1",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.keda.sh_v1alpha1",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor.monitoring.coreos.com_v1",
    ("networking.gke.io/v1", "HealthCheckPolicy"): "healthcheckpolicies.networking.gke.io_v1",
    ("networking.gke.io/v1", "GCPBackendPolicy"): "gcpbackendpolicies.networking.gke.io_v1",
}
EPP_SCHEMA = "endpointpickerconfig.inference.networking.x-k8s.io_v1alpha1"
GIE = json.loads((K8S / "gateway-api-inference-extension_v1.5.0.json").read_text())
PORT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")  # IANA_SVC_NAME, at most 15 characters
# Labels Prometheus gives every series a PodMonitor scrapes (prometheus-operator v0.93.0,
# pkg/prometheus/promcfg.go generatePodMonitorConfig); the rest come from the exporter.
TARGET_LABELS = ("namespace", "pod", "container", "endpoint", "job")


# --- one object against its schema ----------------------------------------------------------------
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


# --- the API server's and the controllers' rules across objects -----------------------------------
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
    monitor = find(docs, "PodMonitor", RELEASE)
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


# --- the endpoint picker --------------------------------------------------------------------------
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


# --- all of them, and the metrics the rules read --------------------------------------------------
def validation_errors(docs: list[dict]) -> list[str]:
    errors = [e for version in KUBE_VERSIONS for doc in docs for e in object_errors(doc, version)]
    errors += cross_object_errors(docs)
    if any(d["kind"] == "InferencePool" for d in docs):
        errors += epp_errors(docs)
    return errors


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


# --- the restricted Pod Security Standard ---------------------------------------------------------
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
