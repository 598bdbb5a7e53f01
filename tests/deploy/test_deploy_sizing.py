"""What a replica is given: memory and CPU for the build, and the times (load, drain, grace periods,
probes, route timeouts, scaling steps) derived from the engine files and the plan.
"""

from __future__ import annotations

import math
from pathlib import Path

from toolkit.deploy.probe import TIMEOUT_S as PROBE_TIMEOUT_S
from toolkit.plan.estimate import estimate_for_plan
from toolkit.repository.reader import open_repository

from chart import (
    IMAGE,
    RELEASE,
    build_container,
    container,
    deploy,
    find,
    flag,
    gateway_seconds,
    invoke,
    server_deployment,
    write_values,
)


# --- resources ------------------------------------------------------------------------------------
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


# --- probes, load and drain times -----------------------------------------------------------------
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
    # the API server refuses it
    assert "terminationGracePeriodSeconds" not in triton["readinessProbe"]
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


def test_load_and_drain_times_come_from_the_engine_files_and_the_plan(gpu_render):
    repo, values, _, _ = gpu_render
    repository = open_repository(repo)
    engine = Path(repository.manifest.engine.parameters["engine_dir"])
    # bytes a replica reads
    loaded = sum((engine / f"rank{r}.engine").stat().st_size for r in range(2))
    hashed = sum(size for size, _, _ in repository.manifest.files.values())  # bytes it checks
    assert (
        values["startup"]["timeoutSeconds"]
        == math.ceil((180 + hashed / 1e9 + loaded / 200e6) / 10) * 10
    )
    plan, limits = repository.memory_plan, repository.limits
    # a stream at full batch takes the plan's estimated TPOT there, with the estimate's tolerance (+25 %)
    full = estimate_for_plan(repository.manifest.model.facts, plan, limits.max_batch_size)
    stream = limits.max_output_len * full.tpot_ms * 1.25 / 1000
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
    # one grace period per replica down
    assert scaling["scaleDown"]["periodSeconds"] == 10 + 500 + 15


def test_route_timeouts_are_gateway_api_durations(cpu_repo, tmp_path):
    """The HTTPRoute's timeout is written in hours, minutes and seconds: at most 5 digits each (the
    chart's schema and the Gateway API's CRD), so a long drain does not make helm refuse the values."""
    for drain, expected in ((86400, "24h"), (3725, "1h2m5s"), (500, "8m20s"), (301, "5m1s")):
        values = deploy(cpu_repo, tmp_path / "d", "--drain-timeout", str(drain))
        assert values["routing"]["httpRoute"]["requestTimeout"] == expected
