"""The rendered deployment against a real served CPU repository (real tritonserver, real API).

- Every metric name and label a rendered autoscaler or routing rule reads is on the live /metrics
  of the served repository under load (Triton's and the API's, the PodMonitor's two endpoints).
- With more requests than batch slots, the engines report what the TensorRT-LLM backend reports
  (active at most max_batch_size, the queue behind it in no engine metric), and the rendered
  autoscaler queries, evaluated on the live series, count the queue.
- The pod's containers, run locally with their rendered command, args and env (each volume mount
  mapped to a local folder), serve on the ports the probes and Services name, and the probes (HTTP
  and exec) pass; Triton's HTTP and gRPC listen on loopback only, its metrics on every address; the
  stop sequence (preStop, then SIGTERM to both containers) finishes an in-flight stream within the
  grace period, refuses new connections and ends every process.
- The build Job's containers rebuild the deployed repository (same fingerprint) and refuse another.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from toolkit.api.app import ApiSettings
from toolkit.api.server import run_api_in_background
from toolkit.model.sources import ResolvedModel
from toolkit.serve.net import free_port
from toolkit.subprocs import session_alive, stop_process

from chart import (
    CRD_APIS,
    NAMESPACE,
    RELEASE,
    container,
    deploy,
    find,
    find_helm,
    flag,
    render,
    server_deployment,
    write_values,
)
from k8s_checks import TARGET_LABELS, rule_selectors, validation_errors
from promql import promql_value
from repos import launch_on_free_ports, python_repository
from sse_events import DONE, sse_events, stream_errors
from tiny import make_tiny_checkpoint

pytestmark = pytest.mark.server

API_KEY = "test-key-of-the-pod"
STREAM_S = 6.0
PROMPT = "Count from 1 to 100: 1, 2, 3,"
EXECUTABLES = {  # what the image has on PATH, here
    "toolkit": str(Path(sys.executable).parent / "toolkit"),
    "python3": sys.executable,
    "sleep": shutil.which("sleep"),
    "sh": shutil.which("sh"),
}


# --- the pod, locally -----------------------------------------------------------------------------
class LocalPod:
    """A rendered pod template's containers as local processes: the same command, args and env;
    emptyDirs and Secrets mapped to local folders; a claim to the folder `claims` names, else to
    its own path (the pods' deployment is rendered with --no-build --mount-path on the folder that
    holds the repository, so the repository is where the pod looks for it)."""

    def __init__(
        self,
        template: dict,
        workdir: Path,
        secrets: dict[str, dict[str, str]],
        claims: dict[str, Path] | None = None,
    ):
        self.spec = template["spec"]
        self.workdir = workdir
        self.volumes: dict[str, Path | None] = {}
        for volume in self.spec["volumes"]:
            local = workdir / "volumes" / volume["name"]
            if "persistentVolumeClaim" in volume:
                # None: the same path
                self.volumes[volume["name"]] = (claims or {}).get(volume["name"])
                continue
            local.mkdir(parents=True)
            if "secret" in volume:
                data = secrets[volume["secret"]["secretName"]]
                for item in volume["secret"].get("items", [{"key": k, "path": k} for k in data]):
                    (local / item["path"]).write_text(data[item["key"]])
            self.volumes[volume["name"]] = local
        self.processes: dict[str, subprocess.Popen] = {}

    def local_path(self, c: dict, value: str) -> str:
        mounts = sorted(c.get("volumeMounts", []), key=lambda m: -len(m["mountPath"]))
        for mount in mounts:
            local = self.volumes[mount["name"]]
            root = mount["mountPath"].rstrip("/")
            if local is not None and (value == root or value.startswith(root + "/")):
                return str(local) + value[len(root) :]
        return value

    def argv(self, c: dict, command: list[str] | None = None) -> list[str]:
        command = command or [*c["command"], *c.get("args", [])]
        assert not any("$$" in a or "$(" in a for a in command), (
            f"{command}: the kubelet expands $$ and $(VAR) in commands; this pod does not"
        )
        return [EXECUTABLES[command[0]], *(self.local_path(c, a) for a in command[1:])]

    def env(self, c: dict) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLKIT_")}
        env["PATH"] = (
            f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"  # the image's PATH
        )
        env.update(
            {e["name"]: self.local_path(c, e["value"]) for e in c.get("env", []) if "value" in e}
        )
        return env

    def start(self, name: str) -> subprocess.Popen:
        c = self.container(name)
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - the process writes to it until it ends
        process = subprocess.Popen(
            self.argv(c),
            env=self.env(c),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes[name] = process
        return process

    def run_init(self, timeout_s: float) -> None:
        for c in self.spec.get("initContainers", []):
            result = subprocess.run(
                self.argv(c), env=self.env(c), capture_output=True, text=True, timeout=timeout_s
            )
            assert result.returncode == 0, f"init container {c['name']}: {result.stderr}"

    def container(self, name: str) -> dict:
        return next(c for c in self.spec["containers"] if c["name"] == name)

    def port(self, c: dict, port) -> int:
        if isinstance(port, int):
            return port
        return next(
            p["containerPort"]
            for x in self.spec["containers"]
            for p in x.get("ports", [])
            if p["name"] == port
        )

    def probe(self, name: str, kind: str) -> bool:
        """Whether the kubelet's probe passes: an httpGet's 200 (from outside the pod's loopback, which
        here is the same), or an exec probe's exit 0 within its timeout."""
        c = self.container(name)
        probe = c[kind]
        timeout_s = probe.get("timeoutSeconds", 1)
        if "exec" in probe:
            argv = self.argv(c, probe["exec"]["command"])
            try:
                done = subprocess.run(argv, env=self.env(c), capture_output=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return False
            return done.returncode == 0
        get = probe["httpGet"]
        try:
            url = f"http://127.0.0.1:{self.port(c, get['port'])}{get['path']}"
            return httpx.get(url, timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_started(self, name: str, limit_s: float) -> None:
        probe = self.container(name)["startupProbe"]
        deadline = time.monotonic() + min(
            limit_s, probe["periodSeconds"] * probe["failureThreshold"]
        )
        while not self.probe(name, "startupProbe"):
            process = self.processes[name]
            assert process.poll() is None, (
                f"{name} exited with {process.returncode}:\n{self.log(name)}"
            )
            assert time.monotonic() < deadline, (
                f"{name}'s startup probe never passed:\n{self.log(name)}"
            )
            time.sleep(0.5)

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        for process in self.processes.values():
            stop_process(process, 10)


@pytest.fixture(scope="module")
def live(served_repo, helm, tmp_path_factory):
    """The deployment of the served CPU repository, rendered with free ports, no build Job (the
    repository is already where the pods mount the volume) and a short preStop for the test."""
    tmp = tmp_path_factory.mktemp("live")
    ports = {
        "tritonHttp": free_port(),
        "tritonGrpc": free_port(),
        "metrics": free_port(),
        "api": free_port(),
    }
    cluster = write_values(tmp / "cluster.yaml", {"ports": ports, "drain": {"preStopSeconds": 1}})
    args = [
        "--no-build",
        "--mount-path",
        served_repo.repo.parent,
        "--drain-timeout",
        "90",
        "--max-replicas",
        "3",
    ]
    values = deploy(served_repo.repo, tmp / "d", "-f", cluster, *args)
    docs = render(helm, tmp / "d", apis=CRD_APIS)
    assert validation_errors(docs) == []
    return tmp, values, docs, ports


def test_rule_metrics_are_on_live_metrics_under_load(live, served_repo):
    _, _, docs, _ = live
    selectors = rule_selectors(docs)
    api = run_api_in_background(
        ApiSettings(served_repo.grpc_url, served_repo.repo), port=free_port()
    )
    model = httpx.get(f"{api.url}/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": PROMPT, "max_tokens": 24, "stream": True, "temperature": 0}

    done = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", f"{api.url}/v1/completions", json=body, timeout=120) as response:
            for _ in response.iter_lines():
                if done.is_set():
                    break  # hang up: the engine cancels the rest

    threads = [threading.Thread(target=stream) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        # The PodMonitor's two endpoints: Triton's metrics port and the API's.
        samples = scrape_under_load(served_repo.metrics_url, threads)
        samples += scrape(f"{api.url}/metrics")
    finally:
        done.set()
        for thread in threads:
            thread.join(120)
        api.stop()
    for where, metric, labels in selectors:
        exporter = {k: v for k, v in labels.items() if k not in TARGET_LABELS}
        found = [
            s
            for s in samples
            if s.name == metric and all(s.labels.get(k) == v for k, v in exporter.items())
        ]
        assert len(found) == 1, f"{where}: {metric}{exporter} selects {len(found)} live series"


def scrape(url: str) -> list:
    text = httpx.get(url, timeout=5).text
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def scrape_under_load(url: str, threads: list[threading.Thread]) -> list:
    """A scrape taken while requests run (the engine reports them scheduled and holding KV blocks)."""
    while any(t.is_alive() for t in threads):
        samples = scrape(url)
        scheduled = sample_value(samples, "nv_trt_llm_request_metrics", request_type="scheduled")
        used = sample_value(
            samples, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="used"
        )
        if scheduled >= 1 and used >= 1:
            return samples
        time.sleep(0.05)
    pytest.fail("no scrape saw a request scheduled while the load ran")


def sample_value(samples: list, name: str, **labels: str) -> float:
    return next(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


SLOTS = 2  # max_batch_size of the queueing test's engine
STEP_MS = 100.0


@pytest.fixture(scope="module")
def two_slot_engine(tmp_path_factory):
    """A synthetic repository with 2 batch slots and 100 ms steps, served; its deployment rendered
    (with autoscaling) for the folder that holds it."""
    root = tmp_path_factory.mktemp("two-slots")
    checkpoint = make_tiny_checkpoint(root / "checkpoint")
    model = ResolvedModel(checkpoint, f"local:{checkpoint}", None)
    repo = python_repository(
        model,
        root / "volume" / "repo",
        "synthetic",
        step_time_ms=STEP_MS,
        max_input_len=128,
        max_output_len=64,
        max_seq_len=256,
        kv_cache_tokens=1024,
        max_batch_size=SLOTS,
    )
    server = launch_on_free_ports(repo, root / "server.log", 120)
    try:
        deploy(repo, root / "d", "--no-build", "--mount-path", repo.parent, "--max-replicas", "3")
        docs = render(find_helm(), root / "d", apis=CRD_APIS)
        yield repo, server, docs
    finally:
        server.stop()


def test_the_autoscaler_counts_requests_queued_beyond_the_batch_slots(two_slot_engine):
    """Six streams on two batch slots: the engine reports what TensorRT-LLM's backend reports (active =
    scheduled = 2, waiting 0: the four queued for a slot are in none of its metrics), and the
    rendered queries, over these live series labelled as the PodMonitor labels them, count 6 in
    flight and 4 waiting for the engine (the old `scheduled + waiting` read 2 and could never
    exceed max_batch_size)."""
    repo, server, docs = two_slot_engine
    api = run_api_in_background(ApiSettings(server.grpc_url, repo), port=free_port())
    model = httpx.get(f"{api.url}/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": PROMPT, "max_tokens": 30, "stream": True}
    finished: list[str | None] = []

    def stream() -> None:
        with httpx.stream("POST", f"{api.url}/v1/completions", json=body, timeout=120) as response:
            chunks = [e for e in sse_events(response.iter_lines()) if e != DONE]
            finished.append(chunks[-1]["choices"][0]["finish_reason"])

    threads = [threading.Thread(target=stream) for _ in range(3 * SLOTS)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            engine, front = scrape(server.metrics_url), scrape(f"{api.url}/metrics")
            scheduled = sample_value(engine, "nv_trt_llm_request_metrics", request_type="scheduled")
            if (
                sample_value(front, "toolkit_api_requests_in_flight") == 3 * SLOTS
                and scheduled == SLOTS
            ):
                break
            assert time.monotonic() < deadline, "the six streams were never in flight at once"
            time.sleep(0.05)
    finally:
        for thread in threads:
            thread.join(120)
        api.stop()
    reported = {
        s.labels["request_type"]: s.value for s in engine if s.name == "nv_trt_llm_request_metrics"
    }
    assert reported == {
        "active": SLOTS,
        "max": SLOTS,
        "scheduled": SLOTS,
        "context": 0,
        "waiting": 0,
    }
    assert finished == ["length"] * 3 * SLOTS  # the queued streams were served in turn, whole
    series = pod_series(engine, "triton") + pod_series(front, "api")
    triggers = {t["name"]: t["metadata"] for t in find(docs, "ScaledObject")["spec"]["triggers"]}
    assert promql_value(triggers["requests-in-flight"]["query"], series) == 3 * SLOTS
    assert promql_value(triggers["waiting-requests"]["query"], series) == 2 * SLOTS


def pod_series(samples: list, container_name: str) -> list[tuple[str, dict, float]]:
    """Samples of one replica's endpoint with the labels the PodMonitor's scrape adds."""
    target = {
        "namespace": NAMESPACE,
        "job": f"{NAMESPACE}/llm",
        "pod": "llm-0",
        "container": container_name,
        "endpoint": "metrics" if container_name == "triton" else "http",
    }
    return [(s.name, {**s.labels, **target}, s.value) for s in samples]


@pytest.fixture(scope="module")
def local_pod(live):
    tmp, values, docs, _ = live
    template = server_deployment(docs)["spec"]["template"]
    secret = values["api"]["auth"]["existingSecret"]
    pod = LocalPod(template, tmp / "pod", {secret: {"keys": f"# the pod's API keys\n{API_KEY}\n"}})
    pod.run_init(timeout_s=60)  # the repository on the volume has the rendered fingerprint
    # It hashed the repository into the cache the servers share: toolkit serve does not hash again.
    assert any((pod.volumes["cache"] / "hashes").iterdir())
    pod.start("triton")
    pod.start("api")
    try:
        pod.wait_started("triton", 300)
        pod.wait_started("api", 120)
        yield pod
    finally:
        pod.stop()


def test_pod_serves_on_the_ports_its_probes_and_services_name(local_pod, live):
    _, _, docs, ports = live
    pod = local_pod
    deadline = time.monotonic() + 60
    while not pod.probe("api", "readinessProbe") and time.monotonic() < deadline:
        time.sleep(0.5)
    for name in ("triton", "api"):
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert pod.probe(name, kind), f"{name}.{kind}"
    # Triton's HTTP and gRPC check no key: on loopback only; its metrics on every address (pod IP).
    listening = listening_addresses()
    assert listening[ports["tritonHttp"]] == listening[ports["tritonGrpc"]] == {"127.0.0.1"}
    assert listening[ports["metrics"]] <= {"0.0.0.0", "::"}
    # tritonserver's log reaches stdout (through `tail -F -s 1`, which polls the file each second).
    deadline = time.monotonic() + 15
    while "Started HTTPService" not in pod.log("triton") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "Started HTTPService" in pod.log("triton")
    template = server_deployment(docs)["spec"]["template"]
    service = find(docs, "Service", "llm")["spec"]["ports"][0]
    api_port = pod.port(container(template["spec"], "api"), service["targetPort"])
    assert (
        api_port == ports["api"] == find(docs, "InferencePool")["spec"]["targetPorts"][0]["number"]
    )
    models = f"http://127.0.0.1:{api_port}/v1/models"
    assert httpx.get(models).status_code == 401  # the keys file from the Secret is read
    assert httpx.get(models, headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
    epp = find(docs, "Deployment", "llm-epp")["spec"]["template"]["spec"]["containers"][0]
    metrics = httpx.get(
        f"http://127.0.0.1:{flag(epp['args'], '--model-server-metrics-port')}/metrics"
    ).text
    assert (
        'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"}'
        in metrics
    )
    for endpoint in find(docs, "PodMonitor", RELEASE)["spec"]["podMetricsEndpoints"]:
        port = pod.port(container(template["spec"], "api"), endpoint["port"])
        assert httpx.get(f"http://127.0.0.1:{port}{endpoint['path']}").status_code == 200


def listening_addresses() -> dict[int, set[str]]:
    """Port -> the local addresses TCP sockets listen on (/proc/net/tcp and tcp6, state 0A)."""
    found: dict[int, set[str]] = {}
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state != "0A":
                continue
            address, port = local.split(":")
            # 32-bit words in host (little-endian) byte order; an IPv4-mapped IPv6 address as IPv4.
            raw = b"".join(bytes.fromhex(address[i : i + 8])[::-1] for i in range(0, width, 8))
            ip = ipaddress.ip_address(raw)
            mapped = getattr(ip, "ipv4_mapped", None)
            found.setdefault(int(port, 16), set()).add(str(mapped or ip))
    return found


def test_pod_stop_sequence_finishes_streams_and_refuses_new_ones(local_pod, live):
    _, _, docs, _ = live
    pod = local_pod
    spec = server_deployment(docs)["spec"]["template"]["spec"]
    api_port = pod.port(pod.container("api"), "http")
    headers = {"Authorization": f"Bearer {API_KEY}"}
    url = f"http://127.0.0.1:{api_port}/v1/completions"
    model = httpx.get(f"http://127.0.0.1:{api_port}/v1/models", headers=headers).json()["data"][0]
    # A stream of about STREAM_S seconds at the speed the shared CPU gives the engine now: long enough
    # to be running at SIGTERM, short enough to finish within the grace period.
    tokens = int(min(160, max(24, stream_tokens_per_s(url, model["id"], headers) * STREAM_S)))
    body = {
        "model": model["id"],
        "prompt": PROMPT,
        "max_tokens": tokens,
        "stream": True,
        "temperature": 0,
    }
    events: list[tuple[float, dict | str]] = []

    def stream() -> None:
        try:
            with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as response:
                for event in sse_events(response.iter_lines()):
                    events.append((time.monotonic(), event))
        except httpx.HTTPError as exc:
            events.append((time.monotonic(), f"ERROR {exc!r}"))

    reader = threading.Thread(target=stream)
    reader.start()
    deadline = time.monotonic() + 120
    while not events and time.monotonic() < deadline:
        time.sleep(0.02)
    assert events, "the stream never started"
    start = time.monotonic()
    # The kubelet: every container's preStop hook, then SIGTERM to each container's first process.
    hooks = [subprocess.Popen(pod.argv({**c, "args": [], "command": c["lifecycle"]["preStop"]["exec"]["command"]}))
             for c in spec["containers"]]  # fmt: skip
    for hook in hooks:
        assert hook.wait(30) == 0
    assert events[-1][1] != "[DONE]", "the stream ended before SIGTERM; make it longer"
    sigterm = time.monotonic()
    for process in pod.processes.values():
        process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{api_port}/v1/models", headers=headers, timeout=3)
    reader.join(spec["terminationGracePeriodSeconds"])
    codes = {
        name: p.wait(spec["terminationGracePeriodSeconds"]) for name, p in pod.processes.items()
    }
    took = time.monotonic() - start
    assert events[-1][1] == "[DONE]", f"the stream did not finish: {events[-3:]}"
    assert not [e for _, e in events if isinstance(e, str) and e.startswith("ERROR")]
    assert not stream_errors(e for _, e in events)
    after = [e for t, e in events if t > sigterm and e != "[DONE]"]
    assert after, "no token was streamed after SIGTERM"
    assert events[-2][1]["choices"][0]["finish_reason"] in ("length", "stop")
    assert took <= spec["terminationGracePeriodSeconds"], f"{took:.1f}s > the grace period"
    assert codes["triton"] == 0, codes
    # a drained stop is a clean exit (uvicorn's re-raise of the SIGTERM is absorbed by toolkit api)
    assert codes["api"] == 0, codes
    assert "Finished server process" in pod.log("api"), pod.log("api")
    # No tritonserver, stub, API or log-tail process is left behind (tail notices within 1 s).
    deadline = time.monotonic() + 5
    while any(session_alive(p.pid) for p in pod.processes.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(session_alive(p.pid) for p in pod.processes.values())


def stream_tokens_per_s(url: str, model: str, headers: dict) -> float:
    """Tokens per second of one greedy stream now: the 15 tokens after the first of a 16-token stream
    over the time from its first chunk to its last (the API may coalesce tokens into one chunk)."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 16, "stream": True, "temperature": 0}
    times = []
    with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as response:
        for event in sse_events(response.iter_lines()):
            if event != DONE:
                times.append(time.monotonic())
    return 15 / max(times[-1] - times[0], 1e-3)


def test_build_job_rebuilds_the_deployed_repository_and_refuses_another(
    served_repo, helm, tmp_path
):
    values = deploy(served_repo.repo, tmp_path / "d")
    fingerprint = values["model"]["fingerprint"]
    docs = render(helm, tmp_path / "d", apis=CRD_APIS)
    template = find(docs, "Job")["spec"]["template"]
    volume = tmp_path / "volume"
    job = LocalPod(template, tmp_path / "job", {}, claims={"models": volume})
    (build,), (check,) = template["spec"]["initContainers"], template["spec"]["containers"]
    env = job.env(build)
    # The volume's cache already holds the embedded checkpoint (as on the Job's second run).
    env["TOOLKIT_HOME"] = str(served_repo.home)
    result = subprocess.run(job.argv(build), env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    repository = Path(job.local_path(build, flag(build["args"], "--output")))
    assert repository == volume / "llm" / fingerprint / "repository"
    # Then the Job's check, as the kubelet runs it after the build: the repository is the deployed one.
    run = {"env": job.env(check), "capture_output": True, "text": True, "timeout": 300}
    result = subprocess.run(job.argv(check), **run)
    assert result.returncode == 0 and f"fingerprint {fingerprint}" in result.stderr, result.stderr
    # A deployment rendered for another repository: the check fails the Job (and so the install).
    other = [("0" * 16 if a == fingerprint else a) for a in check["args"]]
    result = subprocess.run(job.argv(check, [*check["command"], *other]), **run)
    assert result.returncode == 1 and "not the one deployed" in result.stderr
