#!/usr/bin/env bash
# One run on a CUDA machine (written for an H200, not yet run on one): the benchmark, the GPU
# tests (bf16/fp16 against the float64 reference, pools past 2^31 elements, a decode step
# captured in a CUDA graph), the kernel, cache-op, model and step tests on the device, and the
# sm_90 compile report. Everything lands under $OUT; each part has its own time limit, so a
# hang in one still leaves the others' results (the limits add up to 560 s).
#
#     OUT=/tmp/gpu bash bench/gpu_check.sh
set -u
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
if [ -x .venv/bin/python ]; then PY=${PY:-.venv/bin/python}; else PY=${PY:-python3}; fi
export OPENBLAS_NUM_THREADS=1

run() {  # run NAME SECONDS COMMAND...: stdout and stderr to $OUT/NAME.txt, status to status.txt
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
  echo "$name: exit $? after $((SECONDS - start)) s" | tee -a "$OUT/status.txt"
}

nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
run versions 30 "$PY" -c "import torch, triton; print(torch.__version__, torch.version.cuda,
triton.__version__, torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0))"
run kernel_bench 180 "$PY" bench/kernel.py --out "$OUT/kernel.json"
run gpu_tests 180 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py \
  tests/test_paged_step.py --junitxml="$OUT/gpu_tests.xml"
run device_tests 120 "$PY" -m pytest -q -p no:cacheprovider tests/test_paged_attention.py \
  tests/test_cache_ops.py tests/test_paged_step.py tests/test_model.py \
  --junitxml="$OUT/device_tests.xml"
run aot 50 env -u TRITON_INTERPRET PAGED_LAB_AOT=1 TRITON_CACHE_DIR="$OUT/triton-cache" \
  "$PY" -m kernels.aot --json "$OUT/aot.json"
rm -rf "$OUT/triton-cache"
