"""The TensorRT-LLM release the GPU path is pinned to, and what differs in the releases around it.

Pinned: TensorRT-LLM 0.20.0 in NVIDIA's Triton container 25.06 (`tritonserver:25.06-trtllm-python-py3`;
25.07 carries the same release). Why this one:
- it has the TensorRT engine flow (checkpoint -> trtllm-build -> engine) that the tensorrtllm backend
  serves; releases after 1.1 deprecate it and 1.2 removes trtllm-build flags;
- its Triton backend reads `min_tokens` and `seed`: the backend code it was cut from is the last
  revision of github.com/triton-inference-server/tensorrtllm_backend before the backend moved into
  TensorRT-LLM (commit c2e65b8, 2025-05-13, branch r25.05), where the stock models and clients also
  use those names. 0.17-0.19 read `min_length` / `random_seed` (tags v0.17.0-v0.19.0);
- it returns no `num_input_tokens` / `num_output_tokens` (TensorRT-LLM PR #5445 added them after the
  0.20.0 submodule pin of 2025-06-19), so the toolkit's contract does not use them.
Sources, with file, revision and line: tests/data/upstream/triton_backend.json (the backend and its
stock models) and tests/data/upstream/trtllm_tools.json (the build tools' flags).
"""

from __future__ import annotations

import re

PINNED_TRTLLM_VERSION = "0.20.0"
TRITON_TRTLLM_CONTAINER = "nvcr.io/nvidia/tritonserver:25.06-trtllm-python-py3"
# The first Triton TRT-LLM container (`<tag>-trtllm-python-py3`) that carries each TensorRT-LLM release, by
# the exact version the package reports: an engine only loads in the release that built it. Source: the
# "trtllm-python-py3" table of triton-inference-server/server docs/introduction/compatibility.md at commit
# 0f963c9a8c6913aa4cd9b57ee04f9c2b76ee8d2a (docs.nvidia.com's copy of that page ends at 25.12). Later
# containers carrying the same release: 0.20.0 also 25.07; 1.0.0 also 25.10; 1.1.0 also 26.01, 26.02;
# 1.2.1 also 26.05 to 26.07. 25.11 lists "1.0.3.2510", kept as written there.
CONTAINERS = {
    "0.17.0": "25.01",
    "0.17.0.post1": "25.02",
    "0.18.0": "25.03",
    "0.18.2": "25.04",
    "0.19.0": "25.05",
    "0.20.0": "25.06",
    "0.21.0": "25.08",
    "1.0.0": "25.09",
    "1.0.3.2510": "25.11",
    "1.1.0": "25.12",
    "1.2.0": "26.03",
    "1.2.1": "26.04",
}

_VERSION = re.compile(r"^(\d+)\.(\d+)")


def version_tuple(version: str) -> tuple[int, int] | None:
    match = _VERSION.match(version.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None


def container_for(version: str) -> str | None:
    """The first Triton TRT-LLM container image that carries `version`; None when the table has no row for
    that exact version (no other container can load its engines)."""
    tag = CONTAINERS.get(version.strip())
    return f"nvcr.io/nvidia/tritonserver:{tag}-trtllm-python-py3" if tag else None
