"""The chart renders for a CPU and an H100 repository, every object validates, and the chart refuses
values that cannot run.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from toolkit.deploy.fingerprint import fingerprint
from toolkit.repository.reader import open_repository

from chart import (
    CRD_APIS,
    HUB_REVISION,
    IMAGE,
    KUBE_VERSIONS,
    RELEASE,
    ROOT,
    build_container,
    container,
    deploy,
    find,
    flag,
    helm_template,
    invoke,
    matches,
    render,
    server_deployment,
    write_values,
)
from k8s_checks import validation_errors


# --- renders --------------------------------------------------------------------------------------
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
         "NetworkPolicy", "PersistentVolumeClaim", "PodDisruptionBudget", "PodMonitor", "PodMonitor", "Role",
         "RoleBinding", "ScaledObject", "Service", "Service", "ServiceAccount"]
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


def test_the_documented_cluster_values_deploy_the_h100_repository(helm, gpu_render, tmp_path):
    """The example in docs/deploy.md ("Cluster values") is a working values file: its image too
    (no --image here), with the tag toolkit deploy derives from the engines' Triton container."""
    text = (ROOT / "docs" / "deploy.md").read_text()
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


def test_replicas_spread_over_nodes(gpu_render):
    template = server_deployment(gpu_render[2])["spec"]["template"]
    (spread,) = template["spec"]["topologySpreadConstraints"]
    assert (
        spread["topologyKey"] == "kubernetes.io/hostname"
        and spread["whenUnsatisfiable"] == "ScheduleAnyway"
    )
    assert matches(spread["labelSelector"]["matchLabels"], template["metadata"]["labels"])


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


# --- values the chart refuses ---------------------------------------------------------------------
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


# --- the pinned tools -----------------------------------------------------------------------------
def test_k8s_tools_installer_fails_clearly_where_its_binaries_do_not_run(tmp_path):
    """The pinned helm and kubectl are linux/x86_64 builds: elsewhere the installer fails (as the deploy
    tests do without helm), naming what to install, instead of exiting 0 with nothing installed."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "uname").write_text('#!/bin/sh\n[ "$1" = -m ] && echo aarch64 || echo Linux\n')
    (fake / "uname").chmod(0o755)
    script = ROOT / "scripts" / "install_k8s_tools.sh"
    env = {"PATH": f"{fake}:/usr/bin:/bin"}
    result = subprocess.run(
        ["bash", script, tmp_path / "bin"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 1, result.stderr
    assert (
        "error:" in result.stderr and "aarch64" in result.stderr and "helm v3.17.3" in result.stderr
    )
