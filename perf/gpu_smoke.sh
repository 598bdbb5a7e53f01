#!/usr/bin/env bash
# GPU smoke test: build Llama-3.1-8B-Instruct in fp8 for an H100, serve it, generate, run a short sweep.
#
# NOT RUN BY US: our machines have no GPU. Written to run on one H100 SXM inside NVIDIA's Triton
# TRT-LLM container of the pinned TensorRT-LLM release (0.20.0):
#
#   docker run --rm -it --gpus all --shm-size=2g --ulimit memlock=-1 --ulimit stack=67108864 \
#     -e HF_TOKEN -v "$PWD":/toolkit -w /toolkit \
#     nvcr.io/nvidia/tritonserver:25.06-trtllm-python-py3 bash perf/gpu_smoke.sh
#
# Needs network access (pip, github.com, the Hugging Face hub) and HF_TOKEN with access to
# meta-llama/Llama-3.1-8B-Instruct. Results go to perf/results/gpu_smoke-<date>/.
set -euo pipefail

RECIPE=${RECIPE:-llama-3.1-8b-instruct-h100-sxm-fp8}
TRTLLM_TAG=${TRTLLM_TAG:-v0.20.0}
WORK=${WORK:-/tmp/toolkit-gpu-smoke}
OUT=${OUT:-perf/results/gpu_smoke-$(date +%Y%m%d-%H%M%S)}
PORT=${PORT:-8000}
mkdir -p "$WORK" "$OUT"
export TOOLKIT_HOME="$WORK/home"

echo "== environment"
nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv | tee "$OUT/gpu.csv"
python3 -c "import tensorrt_llm; print('tensorrt_llm', tensorrt_llm.__version__)" | tail -1 | tee "$OUT/trtllm_version.txt"

echo "== toolkit and the TensorRT-LLM example scripts of $TRTLLM_TAG"
python3 -m pip install --quiet -e .
if [ ! -d "$WORK/TensorRT-LLM/examples" ]; then
  git clone --quiet --depth 1 --branch "$TRTLLM_TAG" --filter=blob:none --sparse \
    https://github.com/NVIDIA/TensorRT-LLM.git "$WORK/TensorRT-LLM"
  git -C "$WORK/TensorRT-LLM" sparse-checkout set examples
fi
python3 -m pip install --quiet -r "$WORK/TensorRT-LLM/examples/quantization/requirements.txt"
export TOOLKIT_TRTLLM_EXAMPLES_DIR="$WORK/TensorRT-LLM/examples"

echo "== plan (no GPU needed)"
toolkit plan -m hf:meta-llama/Llama-3.1-8B-Instruct -g h100-sxm --dtype fp8 --kv-dtype fp8 --json | tee "$OUT/plan.json"

echo "== build (dry run, then for real; a second build must be a cache hit)"
toolkit build --target h100-sxm --recipe "$RECIPE" -o "$WORK/repo" --dry-run --json | tee "$OUT/build-dry-run.json"
/usr/bin/time -v toolkit build --target h100-sxm --recipe "$RECIPE" -o "$WORK/repo" --json 2> "$OUT/build.time" | tee "$OUT/build.json"
toolkit build --target h100-sxm --recipe "$RECIPE" -o "$WORK/repo" --json | tee "$OUT/rebuild.json"
python3 - "$OUT/rebuild.json" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
cached = json.dumps(data).count('"cached": true')
print("rebuild was a cache hit" if cached else "WARNING: rebuild was not a cache hit")
PY

echo "== serve"
GRPC_PORT=$((PORT + 1))
toolkit serve -r "$WORK/repo" --http-port "$PORT" --grpc-port "$GRPC_PORT" --metrics-port $((PORT + 2)) --background --json \
  | tee "$OUT/serve.json"
SERVER=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pid'])" "$OUT/serve.json")
trap 'kill "$SERVER" 2>/dev/null || true' EXIT

echo "== generate (gRPC streaming, then HTTP)"
toolkit generate "What is the capital of France?" -u "localhost:$GRPC_PORT" -n 32 | tee "$OUT/generate.txt"
toolkit generate "What is the capital of France?" -p http -u "localhost:$PORT" -n 32 --json | tee "$OUT/generate.json"

echo "== short sweep: concurrency 1, 8, 32; 128 in / 128 out; each point also against the planner's bound"
toolkit bench -u "localhost:$GRPC_PORT" -r "$WORK/repo" -c 1,8,32 -i 128 -o 128 --out "$OUT/bench" --json > "$OUT/bench.json"
echo "== done: $OUT"
