#!/usr/bin/env bash
# Set up (as scripts/setup.sh) and run the whole test suite; the tests start their own tritonserver.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. "${VENV:-.venv}/bin/activate"
exec python -m pytest -q "$@"
