"""Deploy a built repository on Kubernetes: the values of the chart in deploy/, from the manifest.

    plan_deployment(DeployRequest) -> DeploymentPlan    check the repository, derive the values
    write_deployment(plan, output) -> DeploymentResult  values.yaml, the chart, the image recipes
    fingerprint(manifest) -> str                        what a replica checks before it serves

`python -m toolkit.deploy.wait` is what the chart's init container and build Job run.
"""

from toolkit.deploy.fingerprint import fingerprint
from toolkit.deploy.plan import DeploymentPlan, DeployRequest, plan_deployment
from toolkit.deploy.writer import DeploymentResult, chart_source, write_deployment

__all__ = [
    "DeployRequest",
    "DeploymentPlan",
    "DeploymentResult",
    "chart_source",
    "fingerprint",
    "plan_deployment",
    "write_deployment",
]
