#!/bin/bash
# What issue 8 still needs measured on the H200, in the order it matters; each step writes under ${OUT:-results}.
# Run from the repository root on the GPU machine: bash benchmarks/h200_triton_fp8.sh [step...]
# Steps: tests (all of tests/test_triton.py, ~7 min), deepseek (FP8 rows of the DeepSeek shape, ~4 min),
#        tune (FP8 tiles for Mixtral and DeepSeek), table (every shape, format and token count, and the host overhead).
# The runners read, and the tuner writes, the tuned tables in $OUT/configs (seeded from backends/triton/configs),
# so a tuning run's output is used by the steps after it and can be copied back into the repository.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-results}; mkdir -p "$OUT/configs"
for table in backends/triton/configs/*.json; do [ -e "$OUT/configs/${table##*/}" ] || cp "$table" "$OUT/configs/"; done
export MOE_CORE_TRITON_CONFIGS=$(realpath "$OUT/configs")
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(tests deepseek)
for step in "${steps[@]}"; do
  echo "== $step $(date +%T)"
  case $step in
    tests) python3 -m pytest -q -p no:cacheprovider tests/test_triton.py > "$OUT/pytest_triton.txt" 2>&1; tail -3 "$OUT/pytest_triton.txt" ;;
    deepseek) python3 benchmarks/bench_moe.py --backends triton-dense,triton-fp8,triton-fp8-channel,triton-fp8-block \
        --shapes deepseek --tokens 1,16,64,1024,4096 --json "$OUT/bench_deepseek.json" > "$OUT/bench_deepseek.txt" 2>&1; tail -25 "$OUT/bench_deepseek.txt" ;;
    tune) python3 benchmarks/tune_triton_moe.py --formats fp8,fp8-block --shapes mixtral,deepseek --tokens 1,16,64,1024,4096 \
        > "$OUT/tune_fp8.txt" 2>&1; tail -12 "$OUT/tune_fp8.txt" ;;
    table) python3 benchmarks/bench_moe.py --backends triton-dense,triton-fp8,triton-fp8-channel,triton-fp8-block,triton-nvfp4-w4a16 \
        --tokens 1,16,64,256,1024,4096,8192 --host-overhead --json "$OUT/bench_all.json" > "$OUT/bench_all.txt" 2>&1; tail -40 "$OUT/bench_all.txt" ;;
    *) echo "unknown step $step (tests, deepseek, tune, table)"; exit 2 ;;
  esac
done
echo "== done $(date +%T)"
