"""Deploy a built repository on Kubernetes: the values of the chart in deploy/, from the manifest.

    plan_deployment(DeployRequest) -> DeploymentPlan    check the repository, derive the values
    write_deployment(plan, output) -> DeploymentResult  values.yaml, the chart, the image recipes
    fingerprint(manifest) -> str                        what a replica checks before it serves

In the pods: `toolkit wait-for-repository` (a hidden command) is what the init container and the
build Job run; `python3 -m toolkit.deploy.probe URL` is the triton container's exec probe. The
names below load on first use, so that probe (run every few seconds) imports only itself.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "DeployRequest": "toolkit.deploy.plan",
    "DeploymentPlan": "toolkit.deploy.plan",
    "plan_deployment": "toolkit.deploy.plan",
    "DeploymentResult": "toolkit.deploy.writer",
    "write_deployment": "toolkit.deploy.writer",
    "chart_source": "toolkit.deploy.values",
    "fingerprint": "toolkit.deploy.fingerprint",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
