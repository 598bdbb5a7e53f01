"""The fleet's blind spots, each checked against the Gateway API Inference Extension v1.5.0 record
(tests/data/k8s/gateway-api-inference-extension_v1.5.0.json) and the Gateway API's
(tests/data/k8s/gateway-api_v1.2.0.json):

1. the picker's pprof is off, its metrics port on no Service, a NetworkPolicy admits only the gateway
   and the scrapers; metrics auth, when on, comes with its cluster RBAC;
2. on GKE, health-check and backend-timeout policies for the pool, behind a value;
3. the route needs Gateway API v1.2.0 standard CRDs and a Gateway that admits its namespace;
4. two releases cannot both match every /v1 request on one Gateway;
5. the picker never sends a replica past the API's 429 cap (its in-flight filter);
6. prefix affinity only where the engine reuses KV blocks;
and the front end's size: API workers and CPU from the plan's estimate, tracing to an OTLP endpoint.
"""

from __future__ import annotations

import json
import math

import pytest

from toolkit.api.gate import OPEN_PATHS
from toolkit.deploy import sizing
from toolkit.plan.estimate import estimate_for_plan
from toolkit.repository.reader import open_repository

from chart import (
    CRD_APIS,
    DATA,
    K8S,
    LLAMA_8B,
    NAMESPACE,
    RELEASE,
    container,
    deploy,
    epp_config,
    find,
    flag,
    gateway_seconds,
    helm_template,
    hub_variant,
    render,
    server_deployment,
)
from fakes import build_with_fake_trtllm, fake_checkpoint_with_tokenizer
from k8s_checks import GIE, validation_errors

GATEWAY_API = json.loads((K8S / "gateway-api_v1.2.0.json").read_text())
GKE_APIS = ("networking.gke.io/v1/HealthCheckPolicy", "networking.gke.io/v1/GCPBackendPolicy")


def _epp_args(docs) -> list[str]:
    return find(docs, "Deployment", f"{RELEASE}-epp")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]


# --- 1. the picker's pprof, metrics port and network ---------------------------------------------
def test_the_pickers_pprof_is_off_and_only_the_gateway_and_scrapers_reach_it(gpu_render):
    _, values, docs, _ = gpu_render
    args = _epp_args(docs)
    assert GIE["flags"]["defaults"]["enable-pprof"] is True  # on unless told: it must be told
    assert "--enable-pprof=false" in args
    assert GIE["pprof"]["served_on"] == "metrics-port"
    metrics_port = GIE["flags"]["ports"]["metrics-port"]
    service = find(docs, "Service", f"{RELEASE}-epp")
    assert [p["port"] for p in service["spec"]["ports"]] == [GIE["flags"]["ports"]["grpc-port"]]
    policy = find(docs, "NetworkPolicy", f"{RELEASE}-epp")
    epp_pod = find(docs, "Deployment", f"{RELEASE}-epp")["spec"]["template"]
    assert (
        policy["spec"]["podSelector"]["matchLabels"].items()
        <= epp_pod["metadata"]["labels"].items()
    )
    ports = {p["name"]: p["containerPort"] for p in epp_pod["spec"]["containers"][0]["ports"]}
    rules = policy["spec"]["ingress"]
    admitted = {ports[p["port"]]: rule.get("from") for rule in rules for p in rule["ports"]}
    assert set(admitted) == {GIE["flags"]["ports"]["grpc-port"], metrics_port}
    # metrics from the monitoring namespace only (the chart's default), never from every pod
    assert admitted[metrics_port] == values_or_default(values, "metricsFrom")


def values_or_default(values: dict, key: str):
    from toolkit.deploy.values import chart_defaults, merge

    return merge(chart_defaults(), values)["routing"]["epp"]["networkPolicy"][key]


def test_picker_metrics_auth_comes_with_the_cluster_rbac_it_needs(helm, gpu_repo, tmp_path):
    repo = hub_variant(gpu_repo, tmp_path)
    deploy(repo, tmp_path / "d")
    extra = (
        "--set", "routing.epp.metricsAuth=true",
        "--set", "routing.epp.metricsReaders[0].kind=ServiceAccount",
        "--set", "routing.epp.metricsReaders[0].name=prometheus-k8s",
        "--set", "routing.epp.metricsReaders[0].namespace=monitoring",
    )  # fmt: skip
    docs = render(helm, tmp_path / "d", extra=extra)
    assert "--metrics-endpoint-auth=true" in _epp_args(docs)
    assert (
        validation_errors(docs) == []
    )  # the TokenReview / SubjectAccessReview ClusterRole is there
    reader = find(docs, "ClusterRole", f"{NAMESPACE}-{RELEASE}-epp-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    binding = find(docs, "ClusterRoleBinding", f"{NAMESPACE}-{RELEASE}-epp-metrics-reader")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}
    ]
    # an authenticated port cannot be scraped by the chart's plain PodMonitor
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "PodMonitor"] == [RELEASE]


# --- 2. GKE's policies ------------------------------------------------------------------------------
def test_on_gke_the_pool_gets_a_health_check_on_health_and_a_long_backend_timeout(
    helm, gpu_repo, tmp_path
):
    repo = hub_variant(gpu_repo, tmp_path)
    values = deploy(repo, tmp_path / "d", "--gke")
    docs = render(helm, tmp_path / "d", apis=(*CRD_APIS, *GKE_APIS))
    assert validation_errors(docs) == []  # against the GKE CRDs' schemas
    record = GIE["gke_policies"]
    pool = find(docs, "InferencePool")
    for kind in record["kinds"]:
        policy = find(docs, kind)
        assert policy["apiVersion"] == record["apiVersion"]
        assert policy["spec"]["targetRef"] == {
            **record["target_ref"],
            "name": pool["metadata"]["name"],
        }
    check = find(docs, "HealthCheckPolicy")["spec"]["default"]["config"]
    assert check["type"] == record["health_check"]["type"]
    assert check["httpHealthCheck"]["requestPath"] == record["health_check"]["requestPath"]
    assert check["httpHealthCheck"]["port"] == pool["spec"]["targetPorts"][0]["number"]
    assert record["health_check"]["requestPath"] in OPEN_PATHS  # answered without an API key
    timeout = find(docs, "GCPBackendPolicy")["spec"]["default"]["timeoutSec"]
    route = find(docs, "HTTPRoute")["spec"]["rules"][0]["timeouts"]["request"]
    assert timeout >= gateway_seconds(route) > 30  # GKE's own default would cut streams at 30 s
    assert values["routing"]["gke"]["enabled"] is True


def test_gke_policies_are_off_by_default_and_refused_without_their_crds(
    helm, gpu_render, gpu_repo, tmp_path
):
    _, _, docs, _ = gpu_render
    assert not [d for d in docs if d["apiVersion"].startswith("networking.gke.io")]
    repo = hub_variant(gpu_repo, tmp_path)
    deploy(repo, tmp_path / "d", "--gke")
    result = helm_template(helm, tmp_path / "d")
    assert result.returncode != 0 and "networking.gke.io/v1 HealthCheckPolicy" in result.stderr


# --- 3 and 4. the route against what the cluster holds ---------------------------------------------
def _route_problems(helm, out, cases: dict[str, str], extra=(), **kw) -> dict[str, str]:
    """toolkit.routeProblem for each case: a template expression of what the cluster holds (lookup is
    empty under helm template, so the cluster is given here, as the build-needed test does)."""
    lines = "\n".join(
        f'  {name}: {{{{ include "toolkit.routeProblem" (merge (dict "root" $) ({found})) | quote }}}}'
        for name, found in cases.items()
    )
    (out / "chart" / "templates" / "route-check.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: route-check}\ndata:\n" + lines + "\n"
    )
    return find(render(helm, out, extra=extra, **kw), "ConfigMap", "route-check")["data"]


def _crd(version: str, channel: str = "standard") -> str:
    keys = GATEWAY_API["crd_annotations"]
    return (
        f'"crd" (dict "metadata" (dict "annotations" (dict "{keys["bundle_version"]}" "{version}" '
        f'"{keys["channel"]}" "{channel}")))'
    )


def _gateway(namespace: str, source: str, selector: str = "", expressions: str = "") -> str:
    """A Gateway whose listener admits routes `from` source; `selector`: its matchLabels' pairs,
    `expressions`: its matchExpressions, as template expressions."""
    parts = (f'"matchLabels" (dict {selector})' if selector else "") + (
        f' "matchExpressions" (list {expressions})' if expressions else ""
    )
    namespaces = f'"from" "{source}"' + (f' "selector" (dict {parts})' if parts else "")
    return (
        f'"gateway" (dict "metadata" (dict "name" "inference-gateway" "namespace" "{namespace}") "spec" '
        f'(dict "listeners" (list (dict "name" "http" "allowedRoutes" (dict "namespaces" (dict {namespaces}))))))'
    )


def test_the_route_needs_gateway_api_v1_2_and_a_gateway_that_admits_it(helm, cpu_repo, tmp_path):
    assert GATEWAY_API["rule_timeouts"]["standard_channel_since"] == "v1.2.0"
    out = tmp_path / "d"
    deploy(cpu_repo, out)
    other = '"namespace" (dict "metadata" (dict "labels" (dict "team" "ml")))'
    ml, web = '"team" "ml"', '"team" "web"'
    tier = '(dict "key" "tier" "operator" "Exists")'  # the namespace has no tier label
    data = _route_problems(helm, out, {
        "old": f"dict {_crd('v1.1.0')}",
        "new": f"dict {_crd('v1.2.0')}",
        "experimental": f"dict {_crd('v1.1.0', 'experimental')}",
        "same": f"dict {_crd('v1.3.0')} {_gateway('gateways', 'Same')}",
        "all": f"dict {_crd('v1.3.0')} {_gateway('gateways', 'All')}",
        "selected": f'dict {_gateway("gateways", "Selector", ml)} {other}',
        "not-selected": f'dict {_gateway("gateways", "Selector", web)} {other}',
        "nothing": "dict",
        # matchExpressions count too (they were ignored: a listener selecting only by them admitted all)
        **{
            f"expression-{name}": f'dict {_gateway("gateways", "Selector", expressions=e)} {other}'
            for name, e in {
                "in": '(dict "key" "team" "operator" "In" "values" (list "ml" "data"))',
                "exists": '(dict "key" "team" "operator" "Exists")',
                "not-in-other": '(dict "key" "team" "operator" "NotIn" "values" (list "web"))',
                "absent-other": '(dict "key" "tier" "operator" "DoesNotExist")',
                "in-other": '(dict "key" "team" "operator" "In" "values" (list "web"))',
                "not-in": '(dict "key" "team" "operator" "NotIn" "values" (list "ml"))',
                "absent": '(dict "key" "team" "operator" "DoesNotExist")',
                "missing": '(dict "key" "tier" "operator" "Exists")',
            }.items()
        },
        "labels-and-expression": f'dict {_gateway("gateways", "Selector", ml, tier)} {other}',
    }, extra=("--set", "routing.gateway.namespace=gateways"))  # fmt: skip
    assert "v1.2.0" in data["old"] and "v1.1.0" in data["old"]
    assert data["new"] == data["experimental"] == data["all"] == data["selected"] == ""
    assert data["nothing"] == ""  # helm template: nothing to check against
    for case in ("in", "exists", "not-in-other", "absent-other"):
        assert data[f"expression-{case}"] == "", case
    for case in ("expression-in-other", "expression-not-in", "expression-absent", "expression-missing",
                 "labels-and-expression"):  # fmt: skip
        assert "allowedRoutes" in data[case], case
    for case in ("same", "not-selected"):
        assert "allowedRoutes" in data[case] and "gateways/inference-gateway" in data[case]
    docs = (DATA.parent.parent / "docs" / "deploy.md").read_text()
    assert "v1.2.0" in docs and "allowedRoutes" in docs
    # GKE manages its clusters' Gateway API CRDs: the fix there is GKE's version, not standard-install.yaml
    # (that fix was given on GKE too)
    gke = GATEWAY_API["gke_managed_crds"]["v1.2.0_since"]
    on_gke = _route_problems(
        helm, out, {"old": f"dict {_crd('v1.1.0')}"}, extra=("--set", "routing.gke.enabled=true"),
        apis=(*CRD_APIS, *GKE_APIS),
    )["old"]  # fmt: skip
    assert f"GKE {gke} or newer" in on_gke and "standard-install" not in on_gke
    assert "standard-install" in data["old"] and "GKE" not in data["old"]
    assert gke in docs


def test_timeouts_a_cluster_file_shortens_below_the_longest_request_are_said(cpu_repo, tmp_path):
    """A cluster file's 30 s route timeout (or GKE backend timeout, the very default the policy is there to
    lift) beside a 512 s drain was written without a word: the gateway would cut every longer stream."""
    from chart import IMAGE, invoke, write_values

    short = write_values(
        tmp_path / "short.yaml",
        {"routing": {"httpRoute": {"requestTimeout": "30s"}, "gke": {"backendTimeoutSec": 30}}},
    )
    result = invoke(
        "deploy", "--repo", cpu_repo, "-o", tmp_path / "d", "--image", IMAGE, "--gke", "-f", short
    )
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"routing.httpRoute.requestTimeout=30s in {short} is shorter than" in said
    assert f"routing.gke.backendTimeoutSec=30 in {short} is shorter than" in said
    plain = invoke("deploy", "--repo", cpu_repo, "-o", tmp_path / "p", "--image", IMAGE, "--gke")
    assert plain.exit_code == 0 and "is shorter than" not in plain.output


def test_the_route_checks_read_the_cluster_only_where_the_installer_may(helm, cpu_repo, tmp_path):
    """They read cluster-scoped objects (the HTTPRoute CRD, the Namespace) and every namespace's
    HTTPRoutes, and Helm fails the whole install on a `forbidden` from a lookup: an installer with a
    namespace's rights only could not install at all. routing.httpRoute.clusterChecks=false skips the
    reads; here the reads are a template that fails, to show whether they run."""
    out = tmp_path / "d"
    deploy(cpu_repo, out)
    helpers = out / "chart" / "templates" / "_helpers.tpl"
    text = helpers.read_text()
    start = text.index('{{- define "toolkit.routeCluster" -}}')
    end = text.index("{{- end -}}", start) + len("{{- end -}}")
    forbidden = '{{- define "toolkit.routeCluster" -}}{{- fail "forbidden: the cluster was read" -}}{{- end -}}'
    helpers.write_text(text[:start] + forbidden + text[end:])
    result = helm_template(helm, out)
    assert result.returncode != 0 and "forbidden: the cluster was read" in result.stderr
    docs = render(helm, out, extra=("--set", "routing.httpRoute.clusterChecks=false"))
    assert find(docs, "HTTPRoute")["spec"]["parentRefs"]
    deploy_md = (DATA.parent.parent / "docs" / "deploy.md").read_text()
    assert "clusterChecks" in deploy_md


# --- KEDA's fallback against the KEDA the cluster runs ----------------------------------------------
def _keda_crd(version: str, behavior: bool) -> str:
    """A ScaledObject CRD as a template expression: its version label, and whether its schema has
    spec.fallback.behavior."""
    fallback = '"replicas" (dict "type" "integer")' + (
        ' "behavior" (dict "type" "string")' if behavior else ""
    )
    schema = (
        '(dict "openAPIV3Schema" (dict "properties" (dict "spec" (dict "properties" '
        f'(dict "fallback" (dict "properties" (dict {fallback})))))))'
    )
    return (
        f'(dict "metadata" (dict "labels" (dict "app.kubernetes.io/version" "{version}")) '
        f'"spec" (dict "versions" (list (dict "name" "v1alpha1" "schema" {schema}))))'
    )


def test_a_keda_that_would_drop_the_fallback_behavior_is_refused(helm, cpu_repo, tmp_path):
    """The ScaledObject's fallback keeps the current replicas while Prometheus fails
    (behavior: currentReplicasIfHigher), a field KEDA 2.17 brought: 2.16's CRD has none, the API
    server prunes it, and a Prometheus outage scaled the release down to its floor, silently."""
    schema = json.loads((K8S / "scaledobject.keda.sh_v1alpha1.schema.json").read_text())
    assert "behavior" in schema["properties"]["spec"]["properties"]["fallback"]["properties"]
    out = tmp_path / "d"
    deploy(cpu_repo, out, "--min-replicas", "1", "--max-replicas", "3")
    assert find(render(helm, out), "ScaledObject")["spec"]["fallback"]["behavior"] == (
        "currentReplicasIfHigher"
    )
    cases = {
        "old": _keda_crd("2.16.1", behavior=False),
        "new": _keda_crd("2.17.0", behavior=True),
        "none": "(dict)",  # helm template, or no KEDA (the API check refuses that before)
    }
    lines = "\n".join(
        f'  {name}: {{{{ include "toolkit.kedaProblem" (dict "crd" {crd}) | quote }}}}'
        for name, crd in cases.items()
    )
    check = out / "chart" / "templates" / "keda-check.yaml"
    check.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: keda-check}\ndata:\n" + lines + "\n"
    )
    data = find(render(helm, out), "ConfigMap", "keda-check")["data"]
    check.unlink()
    assert "(2.16.1) is older than 2.17" in data["old"] and "autoscaling.minReplicas" in data["old"]
    assert "upgrade KEDA to 2.17" in data["old"] and "clusterChecks=false" in data["old"]
    assert data["new"] == "" and data["none"] == ""
    # The read is cluster-scoped: only with autoscaling.clusterChecks, and only with autoscaling on
    # (here it is a template that fails, to show whether it runs).
    helpers = out / "chart" / "templates" / "_helpers.tpl"
    text = helpers.read_text()
    start = text.index('{{- define "toolkit.kedaCrd" -}}')
    end = text.index("{{- end -}}", start) + len("{{- end -}}")
    forbidden = (
        '{{- define "toolkit.kedaCrd" -}}{{- fail "forbidden: KEDA\'s CRD was read" -}}{{- end -}}'
    )
    helpers.write_text(text[:start] + forbidden + text[end:])
    result = helm_template(helm, out)
    assert result.returncode != 0 and "forbidden: KEDA's CRD was read" in result.stderr
    assert find(
        render(helm, out, extra=("--set", "autoscaling.clusterChecks=false")), "ScaledObject"
    )
    assert not [
        d
        for d in render(helm, out, extra=("--set", "autoscaling.enabled=false"))
        if d["kind"] == "ScaledObject"
    ]


def _route(
    name: str,
    namespace: str = "other",
    hostnames=(),
    header: str | None = None,
    path: tuple[str, str] | None = ("PathPrefix", "/v1"),
) -> str:
    """An HTTPRoute on this release's Gateway with one match: `path` (type, value; None: no path match,
    which the Gateway API reads as PathPrefix /), `header` x-model's value."""
    match = f'(dict "path" (dict "type" "{path[0]}" "value" "{path[1]}")' if path else "(dict"
    if header:
        match += f' "headers" (list (dict "type" "Exact" "name" "x-model" "value" "{header}"))'
    match += ")"
    hosts = (
        f' "hostnames" (list {" ".join(chr(34) + h + chr(34) for h in hostnames)})'
        if hostnames
        else ""
    )
    return (
        f'(dict "metadata" (dict "name" "{name}" "namespace" "{namespace}") "spec" (dict "parentRefs" '
        f'(list (dict "name" "inference-gateway" "namespace" "{NAMESPACE}")){hosts} "rules" (list (dict '
        f'"matches" (list {match})))))'
    )


def test_two_releases_cannot_both_match_every_v1_request_on_one_gateway(helm, cpu_repo, tmp_path):
    out = tmp_path / "d"
    deploy(cpu_repo, out)
    cases = {
        "collides": f'dict "routes" (dict "items" (list {_route("older")}))',
        "own-hostname": f'dict "routes" (dict "items" (list {_route("older", hostnames=("a.example.com",))}))',
        "own-header": f'dict "routes" (dict "items" (list {_route("older", header="other-model")}))',
        "itself": f'dict "routes" (dict "items" (list {_route(RELEASE, namespace=NAMESPACE)}))',
        # Gateway API precedence: an exact path, then the longest prefix wins. A path under /v1 takes the
        # requests under it; a shorter prefix (a default backend on /) takes none of this release's
        # (those were refused: every install beside a catch-all route failed)
        **{
            name: f'dict "routes" (dict "items" (list {_route("older", path=path)}))'
            for name, path in {
                "under": ("PathPrefix", "/v1/chat"),
                "exact-under": ("Exact", "/v1/models"),
                "trailing-slash": ("PathPrefix", "/v1/"),
                "catch-all": None,
                "root": ("PathPrefix", "/"),
                "sibling": ("PathPrefix", "/v10"),
                "exact-v1": ("Exact", "/v1"),
            }.items()
        },
    }  # fmt: skip
    data = _route_problems(helm, out, cases)
    assert "other/older" in data["collides"] and "routing.httpRoute.hostnames" in data["collides"]
    assert data["own-hostname"] == data["own-header"] == data["itself"] == ""
    for case in ("under", "exact-under", "trailing-slash"):
        assert "other/older" in data[case], case
    for case in ("catch-all", "root", "sibling", "exact-v1"):
        assert data[case] == "", case
    assert (GATEWAY_API["route_precedence"]["across_rules"][:2]) == [
        "Exact path match",
        "Prefix path match with the largest number of characters",
    ]
    # with a header of its own, this release no longer collides with the older route
    deploy(cpu_repo, out, "--route-header", "x-model=tiny", "--route-hostname", "Tiny.Example.com")
    assert _route_problems(helm, out, {"collides": cases["collides"]})["collides"] == ""
    route = find(render(helm, out), "HTTPRoute")["spec"]
    assert route["hostnames"] == ["tiny.example.com"]
    assert route["rules"][0]["matches"][0]["headers"] == [
        {"type": "Exact", "name": "x-model", "value": "tiny"}
    ]
    # precedence across routes: ties go to the oldest, so an identical match starves the newer route
    assert GATEWAY_API["route_precedence"]["ties_across_routes"][0].startswith("the oldest Route")


def test_route_flags_that_the_gateway_api_refuses_are_refused(cpu_repo, tmp_path):
    from chart import invoke

    for args, message in (
        (("--route-header", "x-model"), "NAME=VALUE"),
        (("--route-hostname", "not a host"), "not a hostname"),
        (("--otlp-endpoint", "collector:4318"), "not an http(s) URL"),
        (("--otlp-endpoint", "http://otel:4318/v1/traces"), "drop /v1/traces"),
        (("--otlp-endpoint", "http://otel:4318 x"), "not an http(s) URL of a host"),
    ):
        result = invoke("deploy", "--repo", cpu_repo, "-o", tmp_path / "d", *args)
        assert result.exit_code == 1 and message in result.output, result.output


# --- 5. never past a replica's 429 cap ------------------------------------------------------------
def test_the_picker_filters_out_a_replica_at_the_apis_in_flight_cap(gpu_render):
    _, values, docs, _ = gpu_render
    config = epp_config(docs)
    record = GIE["concurrency_detector"]
    plugins = {p["type"]: p for p in config["plugins"]}
    assert record["needs_producer"] in plugins  # the load it filters on
    detector = plugins[record["type"]]["parameters"]
    assert detector["concurrencyMode"] == "requests"
    # the same cap the API answers 429 at, no headroom past it
    assert detector["maxConcurrency"] == values["api"]["maxInFlight"]
    assert detector["headroom"] == 0
    api = container(server_deployment(docs)["spec"]["template"]["spec"], "api")
    assert int(flag(api["args"], "--max-in-flight")) == detector["maxConcurrency"]
    profile = config["schedulingProfiles"][0]["plugins"]
    assert profile[0] == {"pluginRef": record["type"]}  # a filter, before the scorers


# --- 6. prefix affinity only where the engine reuses KV blocks ------------------------------------
@pytest.fixture(scope="module")
def gpu_repo_without_reuse(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("no-reuse")
    checkpoint = fake_checkpoint_with_tokenizer(tmp, LLAMA_8B)
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    result = build_with_fake_trtllm(
        tmp, "--target", "h100-sxm", "--model", checkpoint, "--dtype", "fp8", "--kv-dtype", "fp8",
        "--no-kv-cache-reuse", "--output", tmp / "volume" / "repo",
        "--engine-dir", tmp / "volume" / "engines" / "llama",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return hub_variant(tmp / "volume" / "repo", tmp)


def _prefix_weight(config: dict) -> float | None:
    for plugin in config["schedulingProfiles"][0]["plugins"]:
        if plugin["pluginRef"] == "prefix-cache-scorer":
            return plugin["weight"]
    return None


def test_prefix_affinity_only_where_the_engine_reuses_kv_blocks(
    helm, gpu_render, cpu_repo, gpu_repo_without_reuse, tmp_path
):
    repo, values, docs, _ = gpu_render
    assert json.loads((repo / "manifest.json").read_text())  # reuse on: the default
    assert values["routing"]["epp"]["weights"]["prefixCache"] > 0
    assert _prefix_weight(epp_config(docs)) == values["routing"]["epp"]["weights"]["prefixCache"]
    for name, repository in (("cpu", cpu_repo), ("no-reuse", gpu_repo_without_reuse)):
        values = deploy(repository, tmp_path / name)
        assert values["routing"]["epp"]["weights"]["prefixCache"] == 0
        config = epp_config(render(helm, tmp_path / name))
        assert _prefix_weight(config) is None
        assert "prefix-cache-scorer" not in {p["type"] for p in config["plugins"]}


# --- the front end's size, and tracing --------------------------------------------------------------
def _api_cores(repo, transport: str) -> float:
    """The API's cores for a replica of `repo` at full batch: the plan's estimated tokens/s at its upper
    tolerance, each token the API's measured CPU over `transport`, with headroom."""
    repository = open_repository(repo)
    plan = repository.memory_plan
    slots = plan.max_batch_size * plan.pp_size
    tokens_per_s = estimate_for_plan(
        repository.manifest.model.facts, plan, slots
    ).output_tokens_per_s
    us = sizing.API_US_PER_TOKEN[transport]
    return tokens_per_s * 1.25 * us / 1e6 * sizing.API_CPU_HEADROOM


def test_api_workers_and_cpu_come_from_the_plans_estimated_tokens_per_s(
    gpu_render, cpu_repo, tmp_path
):
    repo, values, docs, _ = gpu_render
    # the chart reads the engine over Triton's HTTP generate_stream by default
    assert values["api"]["workers"] == math.ceil(_api_cores(repo, "http")) > 1
    assert values["api"]["resources"]["requests"]["cpu"] == str(values["api"]["workers"])
    api = container(server_deployment(docs)["spec"]["template"]["spec"], "api")
    assert flag(api["args"], "--workers") == str(values["api"]["workers"])
    assert api["resources"]["requests"]["cpu"] == str(values["api"]["workers"])
    assert deploy(cpu_repo, tmp_path / "cpu")["api"]["workers"] == 1  # a CPU engine's few tokens/s


def test_workers_a_cluster_file_sets_get_their_own_cpu_and_memory(gpu_render, tmp_path):
    """api.workers: 2 in a cluster file kept the CPU derived for 4 workers (and the note was gone); its
    resources now follow the workers it sets, and resources it sets itself are kept as they are."""
    from chart import write_values

    repo, values, _, _ = gpu_render
    assert values["api"]["workers"] != 2
    two = deploy(
        repo, tmp_path / "two", "-f", write_values(tmp_path / "w.yaml", {"api": {"workers": 2}})
    )
    assert two["api"]["workers"] == 2
    assert two["api"]["resources"] == sizing.api_resources(2)
    own = {"api": {"workers": 2, "resources": {"requests": {"cpu": "3", "memory": "2Gi"}}}}
    kept = deploy(repo, tmp_path / "own", "-f", write_values(tmp_path / "o.yaml", own))
    assert kept["api"]["resources"]["requests"] == {"cpu": "3", "memory": "2Gi"}


def test_the_api_is_sized_for_the_engine_transport_a_cluster_file_chooses(gpu_render, tmp_path):
    """At a GPU engine's pace the API spends about twice the CPU per token reading the engine over gRPC as
    over Triton's HTTP generate_stream (perf/results/api_front_end_gpu_pace.md): a cluster file that sets
    api.engineTransport to grpc gets the workers and CPU for gRPC (one figure sized both before), and the
    note says which transport it sized for."""
    from chart import IMAGE, invoke, write_values

    repo, values, _, _ = gpu_render
    grpc_file = write_values(tmp_path / "grpc.yaml", {"api": {"engineTransport": "grpc"}})
    grpc = deploy(repo, tmp_path / "g", "-f", grpc_file)
    assert grpc["api"]["workers"] > values["api"]["workers"]
    assert grpc["api"]["workers"] == math.ceil(_api_cores(repo, "grpc"))
    assert grpc["api"]["resources"]["requests"]["cpu"] == str(grpc["api"]["workers"])
    result = invoke(
        "deploy",
        "--repo",
        repo,
        "-o",
        tmp_path / "n",
        "--image",
        IMAGE,
        "-f",
        grpc_file,
        "--dry-run",
    )
    assert result.exit_code == 0, result.output
    assert f"{sizing.API_US_PER_TOKEN['grpc']:g} us of API CPU per token over grpc" in result.output
    bad = write_values(tmp_path / "bad.yaml", {"api": {"engineTransport": "websocket"}})
    result = invoke("deploy", "--repo", repo, "-o", tmp_path / "b", "--image", IMAGE, "-f", bad)
    assert result.exit_code == 1
    assert f"api.engineTransport=websocket in {bad} is not an engine transport" in result.output
    assert "grpc, http" in result.output and not (tmp_path / "b").exists()


def test_tracing_goes_to_the_otlp_endpoint_from_every_layer(helm, cpu_repo, tmp_path, gpu_render):
    url = "http://otel-collector.monitoring:4318"
    deploy(cpu_repo, tmp_path / "d", "--otlp-endpoint", url, "--trace-rate", "0.05")
    pod = server_deployment(render(helm, tmp_path / "d"))["spec"]["template"]["spec"]
    for name in ("triton", "api"):
        box = container(pod, name)
        assert flag(box["args"], "--otlp-endpoint") == url
        assert flag(box["args"], "--trace-rate") == "0.05"
        assert {"name": "OTEL_SERVICE_NAME", "value": RELEASE} in box["env"]
    # Triton traces only what the API sampled (it carries the API's context)
    assert "--trace-context-only" in container(pod, "triton")["args"]
    untraced = server_deployment(gpu_render[2])["spec"]["template"]["spec"]
    assert not any("--otlp-endpoint" in c["args"] for c in untraced["containers"])


def test_the_api_container_args_are_flags_toolkit_api_takes_with_the_values_given(
    helm, cpu_repo, tmp_path
):
    """The chart's API command line, parsed by `toolkit api --dry-run` itself (the repository and key file
    paths swapped for local ones): every flag exists, and the values reach the settings."""
    from chart import invoke, write_values

    deploy(cpu_repo, tmp_path / "d")
    cluster = write_values(tmp_path / "c.yaml", {"api": {"streamInterval": 4, "workers": 2}})
    docs = render(helm, tmp_path / "d", extra=["-f", cluster])
    args = container(server_deployment(docs)["spec"]["template"]["spec"], "api")["args"]
    keys = tmp_path / "keys"
    keys.write_text("a-key\n")
    local = {"--repo": str(cpu_repo), "--api-key-file": str(keys), "-k": str(keys)}
    args = [local.get(args[i - 1], a) if i else a for i, a in enumerate(args)]
    result = invoke("api", *args, "--dry-run")
    assert result.exit_code == 0, result.output
    settings = json.loads(result.stdout)
    assert (settings["stream_interval"], settings["workers"]) == (4, 2)
    assert (
        settings["engine_http_url"] == "127.0.0.1:8000"
    )  # by default, Triton's HTTP port in the pod
    grpc = write_values(tmp_path / "g.yaml", {"api": {"engineTransport": "grpc"}})
    args = container(
        server_deployment(render(helm, tmp_path / "d", extra=["-f", grpc]))["spec"]["template"][
            "spec"
        ],
        "api",
    )["args"]
    assert "--engine-http-url" not in args
