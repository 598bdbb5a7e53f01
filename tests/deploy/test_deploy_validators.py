"""The offline checks of a render (k8s_checks.py) find what they are for: each kind of broken object."""

from __future__ import annotations

import json

import yaml

from chart import RELEASE, deploy, find, render, server_deployment
from k8s_checks import validation_errors


def test_the_validators_refuse_broken_objects(helm, cpu_repo, tmp_path):
    deploy(cpu_repo, tmp_path / "d", "--max-replicas", "3")
    docs = render(helm, tmp_path / "d")
    assert validation_errors(docs) == []
    broken = json.loads(json.dumps(docs))
    server_deployment(broken)["spec"]["template"]["spec"]["containers"][0]["extraField"] = 1
    find(broken, "ScaledObject")["spec"]["triggers"][0]["metadata"]["threshold"] = 4
    ports = find(broken, "InferencePool")["spec"]["targetPorts"]
    ports.append(dict(ports[0]))
    find(broken, "PodMonitor", RELEASE)["spec"]["podMetricsEndpoints"][0]["port"] = "nope"
    find(broken, "Service", RELEASE)["spec"]["ports"][0]["targetPort"] = "grpc"
    epp = find(broken, "ConfigMap", f"{RELEASE}-epp")
    config = yaml.safe_load(epp["data"]["epp-config.yaml"])
    source = next(p for p in config["plugins"] if p["type"] == "metrics-data-source")
    source["parameters"]["blockSize_tokens"] = 64
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
