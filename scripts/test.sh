#!/usr/bin/env bash
# Set up (as scripts/setup.sh) and run the whole test suite; the tests start their own tritonserver.
# Two pytest-xdist workers, each taking whole files (a module's served fixtures stay on one worker): the suite
# spends most of its time waiting on servers to start, drain and stop, so two halve its wall time on 2 cores
# (16:02 -> 8:34 here). TEST_WORKERS=0 runs it in this one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. "${VENV:-.venv}/bin/activate"
exec python -m pytest -q -n "${TEST_WORKERS:-2}" --dist loadfile "$@"
