#!/usr/bin/env bash
# The main job on the embedded default: set up, build the CPU repository of SmolLM2-135M-Instruct, serve it.
# Then, from another shell:  .venv/bin/toolkit generate "What is the capital of France?"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. "${VENV:-.venv}/bin/activate"
toolkit build --target cpu --model smollm2-135m-instruct --output model_repository
exec toolkit serve --repo model_repository "$@"
