"""`toolkit deploy` itself: the values it writes from flags and cluster files, and what it refuses
(naming the value and the fix) before anything is written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from toolkit.plan.gpus import GPU_PROFILES
from toolkit.repository.reader import open_repository

from chart import (
    IMAGE,
    ROOT,
    container,
    deploy,
    flag,
    hub_variant,
    invoke,
    render,
    server_deployment,
    write_values,
)
from k8s_checks import validation_errors


# --- repositories it refuses ----------------------------------------------------------------------
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
    # the cluster's own label spelling
    assert values["gpu"]["products"] == ["NVIDIA-H100-SXM5-80GB"]


def test_modified_repository_is_refused(cpu_repo, tmp_path):
    copy = tmp_path / "volume" / "repo"
    shutil.copytree(cpu_repo, copy)
    (copy / "postprocessing" / "1" / "model.py").write_text("# edited\n")
    result = invoke("deploy", "--repo", copy, "-o", tmp_path / "d", "--image", IMAGE)
    assert result.exit_code == 1 and "postprocessing/1/model.py (modified)" in result.output


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


# --- flags and cluster values ---------------------------------------------------------------------
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


def test_cluster_values_may_repeat_the_gpu_count_the_engines_need(gpu_render, tmp_path):
    """gpu.count is refused in cluster values only where it contradicts the repository (any GPU for a
    cpu or synthetic one, another count than the engine's ranks); docs/deploy.md says so."""
    repo = gpu_render[0]
    cluster = write_values(tmp_path / "c.yaml", {"gpu": {"count": 2}})
    assert deploy(repo, tmp_path / "d", "-f", cluster)["gpu"]["count"] == 2
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text[text.index("## Cluster values") :]
    assert "`gpu.count`) are refused" not in section
    assert "`gpu.count` only where it contradicts" in " ".join(section.split())
    # Triton's metrics server binds IPv4 or IPv6, never both on one socket: the doc says which.
    assert "IPv4" in text and "0.0.0.0" in text


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


def test_replicas_has_no_short_option_that_reads_as_a_namespace(cpu_repo, tmp_path):
    """kubectl and helm read -n as --namespace: `toolkit deploy -n llm` must not mean 'llm replicas'."""
    result = invoke("deploy", "--repo", cpu_repo, "-o", tmp_path / "d", "--image", IMAGE, "-n", "2")
    assert result.exit_code == 1 and "No such option '-n'" in result.output


def test_no_image_is_refused(cpu_repo, tmp_path):
    result = invoke("deploy", "--repo", cpu_repo, "-o", tmp_path / "d")
    assert (
        result.exit_code == 1 and "no toolkit image" in result.output and "--image" in result.output
    )


def test_every_gpu_profile_has_a_node_label():
    assert all(profile.gpu_products for profile in GPU_PROFILES.values())


# --- the output folder ----------------------------------------------------------------------------
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
