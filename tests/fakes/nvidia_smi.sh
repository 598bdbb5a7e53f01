#!/bin/sh
# Fake nvidia-smi: answers `--query-gpu=compute_cap --format=csv,noheader` with FAKE_GPU_SM (default 9.0).
case "$*" in
  *compute_cap*) echo "${FAKE_GPU_SM:-9.0}" ;;
  *) echo "fake nvidia-smi: unsupported arguments: $*" >&2; exit 2 ;;
esac
