#!/usr/bin/env bash
# GPU smoke test: build Llama-3.1-8B-Instruct in fp8 for an H100, serve it, generate, run a short sweep.
#
# NOT RUN BY US: our machines have no GPU. Written to run unchanged on one H100 SXM (or H200) inside
# NVIDIA's Triton TRT-LLM container of the pinned TensorRT-LLM release (0.20.0):
#
#   docker run --rm -it --gpus all --shm-size=2g --ulimit memlock=-1 --ulimit stack=67108864 \
#     -e HF_TOKEN -v "$PWD":/toolkit -w /toolkit \
#     nvcr.io/nvidia/tritonserver:25.06-trtllm-python-py3 bash perf/gpu_smoke.sh
#
# It checks its prerequisites first and says what is missing; then it installs the toolkit into a
# virtualenv that sees the container's own packages (tensorrt_llm stays the container's), fetches
# the TensorRT-LLM example scripts of the pinned tag, and writes everything under perf/results/.
# Needs network access (pip, github.com, the Hugging Face hub) and HF_TOKEN with access to
# meta-llama/Llama-3.1-8B-Instruct.
set -euo pipefail
cd "$(dirname "$0")/.."

RECIPE=${RECIPE:-llama-3.1-8b-instruct-h100-sxm-fp8}
TARGET=${TARGET:-h100-sxm}
TRTLLM_TAG=${TRTLLM_TAG:-v0.20.0}
WORK=${WORK:-/tmp/toolkit-gpu-smoke}
OUT=${OUT:-perf/results/gpu_smoke-$(date +%Y%m%d-%H%M%S)}
PORT=${PORT:-8000}
NEED_DISK_GB=${NEED_DISK_GB:-60}  # the bf16 download (16 GB), the quantized checkpoint and the engine

fail() { echo "gpu_smoke: $1" >&2; echo "  fix: $2" >&2; exit 1; }

echo "== prerequisites"
command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: no NVIDIA driver in this container" \
  "start the container with --gpus all on a machine with an NVIDIA GPU"
nvidia-smi -L >/dev/null 2>&1 || fail "nvidia-smi sees no GPU" "start the container with --gpus all"
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' ')
case "$TARGET:$CAP" in
  h100-*:9.0|h200:9.0) ;;
  *) fail "GPU 0 has compute capability $CAP; target $TARGET needs 9.0 (Hopper)" \
       "run on an H100/H200, or set TARGET and RECIPE for this GPU (toolkit build -h lists targets)" ;;
esac
PY=$(command -v python3 || true)
[ -n "$PY" ] || fail "python3 not found" "use NVIDIA's Triton TRT-LLM container named above"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || fail "python3 is $("$PY" -V 2>&1); the toolkit needs 3.10 or newer" "use the container named above"
TRTLLM=$("$PY" -c 'import tensorrt_llm; print(tensorrt_llm.__version__)' 2>/dev/null | tail -1 || true)
[ -n "$TRTLLM" ] || fail "python3 cannot import tensorrt_llm" \
  "run inside nvcr.io/nvidia/tritonserver:25.06-trtllm-python-py3 (it carries TensorRT-LLM 0.20.0)"
[ "$TRTLLM" = "${TRTLLM_TAG#v}" ] || echo "warning: tensorrt_llm is $TRTLLM, the examples are $TRTLLM_TAG (set TRTLLM_TAG=v$TRTLLM)"
command -v trtllm-build >/dev/null || fail "trtllm-build is not on PATH" "use the container named above"
command -v tritonserver >/dev/null || [ -x /opt/tritonserver/bin/tritonserver ] \
  || fail "tritonserver not found" "use the container named above"
[ -n "${HF_TOKEN:-}" ] || fail "HF_TOKEN is not set; meta-llama/Llama-3.1-8B-Instruct is gated" \
  "docker run ... -e HF_TOKEN (a token whose account accepted the Llama 3.1 license)"
mkdir -p "$WORK" "$OUT"
FREE_GB=$(df -Pk "$WORK" | awk 'NR==2 {print int($4 / 1048576)}')
[ "$FREE_GB" -ge "$NEED_DISK_GB" ] || fail "$WORK has $FREE_GB GB free; the build needs about $NEED_DISK_GB GB" \
  "mount a larger volume and pass WORK=/that/volume"
command -v git >/dev/null || fail "git not found (the example scripts are fetched with it)" "apt-get install -y git"
export TOOLKIT_HOME="$WORK/home"

echo "== environment"
nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv | tee "$OUT/gpu.csv"
echo "tensorrt_llm $TRTLLM" | tee "$OUT/trtllm_version.txt"

echo "== toolkit (a virtualenv over the container's packages) and the example scripts of $TRTLLM_TAG"
if [ ! -x "$WORK/venv/bin/python" ]; then
  "$PY" -m venv --system-site-packages "$WORK/venv"
fi
# shellcheck disable=SC1091
. "$WORK/venv/bin/activate"
python -m pip install --quiet -e .
if [ ! -d "$WORK/TensorRT-LLM/examples" ]; then
  git clone --quiet --depth 1 --branch "$TRTLLM_TAG" --filter=blob:none --sparse \
    https://github.com/NVIDIA/TensorRT-LLM.git "$WORK/TensorRT-LLM"
  git -C "$WORK/TensorRT-LLM" sparse-checkout set examples
fi
python -m pip install --quiet -r "$WORK/TensorRT-LLM/examples/quantization/requirements.txt"
export TOOLKIT_TRTLLM_EXAMPLES_DIR="$WORK/TensorRT-LLM/examples"
export TOOLKIT_TRTLLM_PYTHON="$PY"  # the interpreter whose tensorrt_llm builds the engine

echo "== plan (offline catalog entry; no GPU needed)"
toolkit plan -m llama-3.1-8b-instruct -g "$TARGET" --dtype fp8 --kv-dtype fp8 --json | tee "$OUT/plan.json"

echo "== build (dry run, then for real, timed; a second build must be a cache hit)"
toolkit build --target "$TARGET" --recipe "$RECIPE" -o "$WORK/repo" --dry-run --json | tee "$OUT/build-dry-run.json"
python - "$OUT/build.time.json" toolkit build --target "$TARGET" --recipe "$RECIPE" -o "$WORK/repo" --json <<'PY' | tee "$OUT/build.json"
# Wall time and peak memory of the build and every process it waited for (no /usr/bin/time needed).
import json, resource, subprocess, sys, time
start = time.monotonic()
code = subprocess.call(sys.argv[2:])
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
json.dump({"exit_code": code, "wall_s": round(time.monotonic() - start, 1),
           "peak_rss_gb_of_largest_child": round(usage.ru_maxrss / 1048576, 2)}, open(sys.argv[1], "w"))
sys.exit(code)
PY
toolkit build --target "$TARGET" --recipe "$RECIPE" -o "$WORK/repo" --json | tee "$OUT/rebuild.json"
python - "$OUT/rebuild.json" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
print("rebuild was a cache hit" if data.get("skipped") or '"cached": true' in json.dumps(data)
      else "WARNING: rebuild was not a cache hit")
PY

echo "== serve"
GRPC_PORT=$((PORT + 1))
toolkit serve -r "$WORK/repo" --http-port "$PORT" --grpc-port "$GRPC_PORT" --metrics-port $((PORT + 2)) --background --json \
  | tee "$OUT/serve.json"
SERVER=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['pid'])" "$OUT/serve.json")
trap 'kill "$SERVER" 2>/dev/null || true' EXIT

echo "== generate (gRPC streaming, then HTTP): the answer must end on <|eot_id|>, not run to -n"
toolkit generate "What is the capital of France?" -u "localhost:$GRPC_PORT" -n 64 | tee "$OUT/generate.txt"
toolkit generate "What is the capital of France?" -p http -u "localhost:$PORT" -n 64 --json | tee "$OUT/generate.json"

echo "== short sweep: concurrency 1, 8, 32, 128; 128 in / 128 out; each point also against the planner's bound"
toolkit bench -u "localhost:$GRPC_PORT" -r "$WORK/repo" -c 1,8,32,128 -i 128 -o 128 --out "$OUT/bench" --json > "$OUT/bench.json"
echo "== done: $OUT"
