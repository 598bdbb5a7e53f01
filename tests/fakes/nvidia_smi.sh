#!/bin/sh
# Fake nvidia-smi: `--query-gpu=compute_cap --format=csv,noheader` answers FAKE_GPU_SM (default 9.0) and
# `--query-gpu=name --format=csv,noheader` one line per GPU, FAKE_GPU_COUNT of them (default 8).
case "$*" in
  *compute_cap*) echo "${FAKE_GPU_SM:-9.0}" ;;
  *query-gpu=name*)
    n=0
    while [ "$n" -lt "${FAKE_GPU_COUNT:-8}" ]; do echo "NVIDIA H100 80GB HBM3"; n=$((n + 1)); done ;;
  *) echo "fake nvidia-smi: unsupported arguments: $*" >&2; exit 2 ;;
esac
