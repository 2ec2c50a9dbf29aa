#!/usr/bin/env bash
# One run on a CUDA machine (written for an H200, not yet run on one): the benchmark, the GPU
# tests (bf16/fp16 against the float64 reference, pools past 2^31 elements, a decode step
# captured in a CUDA graph), the kernel (full and local attention), cache-op and step tests on
# the device, and the sm_90 compile report.
#
#     OUT=/tmp/gpu bash bench/gpu_check.sh
#
# It needs only torch, triton, numpy, pytest and hypothesis, so it also runs on a GPU image
# that has those and nothing of the lab's (no streamlit, no model): the device machine lent to
# some sessions has torch 2.11 / Triton 3.6.0 on Python 3.12 and nothing can be installed
# there. The model tests are left out for that reason (the SmolLM2 file, 94 MB, cannot be
# carried there); tests/test_paged_step.py runs the model's every-layer step on random Q/K/V.
#
# What comes back from that machine is at most 8 files, so everything lands in 8 files under
# $OUT: status.txt, env.txt, kernel_bench.txt, kernel.json, gpu_tests.txt, device_tests.txt,
# aot.txt, aot.json. Each part has its own time limit (adding up to 440 s, the parts that
# matter most first), so a hang in one still leaves the others' results.
set -u
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
if [ -x .venv/bin/python ]; then PY=${PY:-.venv/bin/python}; else PY=${PY:-python3}; fi
export OPENBLAS_NUM_THREADS=1 PYTHONUNBUFFERED=1
PYTEST=("$PY" -m pytest -q -rfEs -p no:cacheprovider)

run() {  # run NAME SECONDS COMMAND...: stdout and stderr to $OUT/NAME.txt, status to status.txt
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
  echo "$name: exit $? after $((SECONDS - start)) s" | tee -a "$OUT/status.txt"
}

: >"$OUT/status.txt"
run env 30 "$PY" -c "import sys, torch, triton; print(sys.version); print('torch', torch.__version__,
'cuda', torch.version.cuda, 'triton', triton.__version__); print(torch.cuda.get_device_name(0));
print(torch.cuda.get_device_properties(0))"
timeout 20 nvidia-smi >>"$OUT/env.txt" 2>&1
run kernel_bench 100 "$PY" bench/kernel.py --out "$OUT/kernel.json"
run gpu_tests 140 "${PYTEST[@]}" -m gpu tests/test_kernels_gpu.py tests/test_paged_step.py
run device_tests 110 "${PYTEST[@]}" tests/test_paged_attention.py tests/test_attention_windows.py \
  tests/test_cache_ops.py tests/test_paged_step.py
run aot 40 env -u TRITON_INTERPRET PAGED_LAB_AOT=1 TRITON_CACHE_DIR=/tmp/paged-lab-aot \
  "$PY" bench/aot.py --json "$OUT/aot.json"
