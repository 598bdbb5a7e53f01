"""What reaches the chart's templates from `toolkit deploy`: every string validated, every one quoted.

A value is text that helm pastes into YAML: one holding a newline (an --image, a repository path, a
cluster file's string) wrote keys of its own into the pods (`envFrom: [...]` into every container),
and names checked with `^...$` let a trailing newline through. Rendered with the real helm.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from toolkit.cli.main import cli

from repos import write_test_repository
from tiny import make_tiny_checkpoint

IMAGE = "registry.example.com/ml/toolkit"
INJECTED = "\n          envFrom: [{secretRef: {name: stolen}}]"
CRDS = [
    f"--api-versions={api}"
    for api in (
        "inference.networking.k8s.io/v1/InferencePool",
        "gateway.networking.k8s.io/v1/HTTPRoute",
        "keda.sh/v1alpha1/ScaledObject",
        "monitoring.coreos.com/v1/PodMonitor",
    )
]


@pytest.fixture(scope="module")
def helm() -> str:
    found = shutil.which("helm", path=f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin")
    if found is None:
        pytest.fail("helm is not installed: run scripts/install_k8s_tools.sh .venv/bin")
    return found


@pytest.fixture(scope="module")
def cpu_repo(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("values")
    checkpoint = make_tiny_checkpoint(tmp / "checkpoint")
    return write_test_repository(
        checkpoint, tmp / "volume" / "repo", source="hf:acme/tiny-llama", revision="0" * 40
    )


def _deploy(repo: Path, out: Path, *args: str):
    return CliRunner().invoke(cli, ["deploy", "--repo", str(repo), "-o", str(out), *args])


def _rendered(helm: str, out: Path) -> list[dict]:
    result = subprocess.run(
        [helm, "template", "llm", str(out / "chart"), "-f", str(out / "values.yaml"), *CRDS],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _our_pods(docs: list[dict]) -> list[dict]:
    """The pod specs of the server Deployment and the build Job (not the endpoint picker's)."""
    ours = [
        d
        for d in docs
        if d["kind"] == "Job" or (d["kind"], d["metadata"]["name"]) == ("Deployment", "llm")
    ]
    assert len(ours) == 2, [(d["kind"], d["metadata"]["name"]) for d in docs]
    return [d["spec"]["template"]["spec"] for d in ours]


def _containers(docs: list[dict]) -> list[dict]:
    return [c for pod in _our_pods(docs) for c in pod["containers"] + pod.get("initContainers", [])]


@pytest.mark.parametrize(
    "image",
    [IMAGE + INJECTED, IMAGE + ":1.0" + INJECTED, IMAGE + "\n", "registry.example.com/ml/to olkit"],
)
def test_an_image_that_is_no_image_reference_is_refused(cpu_repo, tmp_path, image):
    result = _deploy(cpu_repo, tmp_path / "out", "--image", image)
    assert result.exit_code == 1, result.output
    assert "--image" in result.output and "fix:" in result.output, result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("flag", "value"), [("--name", "llm\n"), ("--name", "llm\nx")])
def test_names_with_a_trailing_newline_are_refused(cpu_repo, tmp_path, flag, value):
    result = _deploy(cpu_repo, tmp_path / "out", "--image", IMAGE, flag, value)
    assert result.exit_code == 1 and flag in result.output, result.output


def test_a_cluster_string_holding_a_newline_is_refused_naming_its_key(cpu_repo, tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"priorityClassName": "high" + INJECTED}))
    result = _deploy(cpu_repo, tmp_path / "out", "--image", IMAGE, "-f", str(cluster))
    assert result.exit_code == 1, result.output
    assert "priorityClassName" in result.output and "fix:" in result.output, result.output


@pytest.mark.parametrize(
    ("values", "key", "says"),
    [
        ({"notakey": 1}, "notakey", "Additional properties are not allowed"),
        ({"nodeSelector": {"pool": ["a"]}}, "nodeSelector.pool", "is not of type 'string'"),
        ({"api": {"workers": "two"}}, "api.workers", "is not of type 'integer'"),
    ],
)
def test_cluster_values_the_charts_schema_refuses_are_refused_before_anything_is_written(
    helm, cpu_repo, tmp_path, values, key, says
):
    """toolkit deploy wrote them and exited 0; the `helm upgrade` it printed then failed on the chart's
    values.schema.json. Now the same refusal comes first, naming the key and the file."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(values))
    out = tmp_path / "out"
    result = _deploy(cpu_repo, out, "--image", IMAGE, "-f", str(cluster))
    assert result.exit_code == 1, result.output
    assert f"{key} in {cluster}" in result.output and says in result.output, result.output
    assert "values.schema.json" in result.output and "fix:" in result.output
    assert not out.exists()
    # helm refuses the same values
    fine = _deploy(cpu_repo, tmp_path / "fine", "--image", IMAGE)
    assert fine.exit_code == 0, fine.output
    refused = subprocess.run(
        [helm, "template", "llm", str(tmp_path / "fine" / "chart"), "-f",
         str(tmp_path / "fine" / "values.yaml"), "-f", str(cluster), *CRDS],
        capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode != 0 and "values don't meet the specifications" in refused.stderr


def test_a_repository_path_with_a_newline_writes_no_key(helm, cpu_repo, tmp_path):
    odd = tmp_path / "repo\nmodel: {injected: true}\nimage: {repository: evil}"
    shutil.copytree(cpu_repo, odd, symlinks=True)
    out = tmp_path / "out"
    result = _deploy(odd, out, "--image", IMAGE)
    assert result.exit_code == 0, result.output
    values = yaml.safe_load((out / "values.yaml").read_text())
    assert "injected" not in values["model"] and values["image"]["repository"] == IMAGE
    for container in _containers(_rendered(helm, out)):
        assert container["image"].startswith(IMAGE), container["image"]


def test_every_string_the_chart_renders_from_values_is_quoted(helm, cpu_repo, tmp_path):
    """A value helm pastes unquoted is YAML, not text: `yes`, `1e3`, `null` or `a: b` change type or
    shape. Every string a cluster file may set is rendered back as the same string."""
    cluster = tmp_path / "cluster.yaml"
    odd = "on: yes #"  # YAML in a string: a mapping, a boolean and a comment once unquoted
    cluster.write_text(
        yaml.safe_dump(
            {
                "priorityClassName": odd,
                "image": {"pullPolicy": "IfNotPresent"},
                "triton": {"shmSize": "2Gi"},
            }
        )
    )
    out = tmp_path / "out"
    result = _deploy(cpu_repo, out, "--image", IMAGE, "-f", str(cluster))
    assert result.exit_code == 0, result.output
    pods = _our_pods(_rendered(helm, out))
    assert all(pod.get("priorityClassName") == odd for pod in pods), pods
