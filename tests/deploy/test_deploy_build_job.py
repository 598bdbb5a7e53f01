"""The build Job that rebuilds the repository on the cluster's volume, the fingerprint that names
what it built, and the init container that waits for it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.cli.cmd_build import command as build_command
from toolkit.deploy.fingerprint import fingerprint
from toolkit.deploy.wait import check_repository_for, wait_for_repository
from toolkit.errors import DeployError, RepositoryError
from toolkit.model.facts import facts_from_config
from toolkit.plan.gpus import get_gpu
from toolkit.plan.memory import plan_memory
from toolkit.repository.reader import open_repository

from chart import (
    HUB_REVISION,
    IMAGE,
    LLAMA_8B,
    RELEASE,
    build_container,
    container,
    deploy,
    find,
    flag,
    gateway_seconds,
    hub_variant,
    invoke,
    render,
    server_deployment,
)


# --- the build Job --------------------------------------------------------------------------------
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


# --- the fingerprint and the init container's wait ------------------------------------------------
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


def test_the_build_job_has_the_gpus_calibration_needs_beyond_the_engines_ranks(
    helm, gpu_repo, tmp_path
):
    """A build whose calibration spreads the bf16 checkpoint over more GPUs than the engine has ranks
    (--calib-gpus, recorded in the manifest) gets them in its Job; the replicas keep the engine's."""
    repo = hub_variant(gpu_repo, tmp_path)
    manifest = json.loads((repo / "manifest.json").read_text())
    assert manifest["settings"]["calib_gpus"] == 2  # resolved: the engine's TP x PP
    manifest["settings"]["calib_gpus"] = 4
    (repo / "manifest.json").write_text(json.dumps(manifest, indent=2))
    values = deploy(repo, tmp_path / "d")
    assert values["build"]["gpuCount"] == 4 and values["gpu"]["count"] == 2
    assert "--calib-gpus" in values["build"]["args"]
    docs = render(helm, tmp_path / "d")
    assert build_container(docs)["resources"]["limits"]["nvidia.com/gpu"] == 4
    triton = container(server_deployment(docs)["spec"]["template"]["spec"], "triton")
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 2
