"""Secrets and what the pods expose: the hub token reaches only the build Job, API keys come from a
Secret, only the OpenAI API is published, Triton stays on loopback, every pod meets the restricted
Pod Security Standard and a container without a GPU request sees no GPU.
"""

from __future__ import annotations

import json

from chart import (
    CRD_APIS,
    IMAGE,
    ROOT,
    build_container,
    container,
    deploy,
    find,
    flag,
    invoke,
    pod_templates,
    render,
    server_deployment,
    write_values,
)
from k8s_checks import restricted_errors


# --- secrets --------------------------------------------------------------------------------------
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


# --- what the pods expose -------------------------------------------------------------------------
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
        text = (ROOT / "deploy" / "image" / dockerfile).read_text()
        assert text.rstrip().splitlines()[-1] == "USER 1000:1000", dockerfile


def test_containers_without_gpus_see_none(gpu_render):
    """NVIDIA's images default NVIDIA_VISIBLE_DEVICES=all: without a GPU request a container would see every GPU."""
    pod = server_deployment(gpu_render[2])["spec"]["template"]["spec"]
    for c in pod["initContainers"] + pod["containers"]:
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        if "nvidia.com/gpu" in c.get("resources", {}).get("limits", {}):
            assert "NVIDIA_VISIBLE_DEVICES" not in env, c["name"]
        else:
            assert env.get("NVIDIA_VISIBLE_DEVICES") == "void", c["name"]
