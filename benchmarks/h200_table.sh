#!/bin/bash
# Issue 18's table on a GPU machine: every shape, every Triton format, T in 1..8192, one shape per process (each
# capped so the rest still run within one call of about 10 minutes), JSON and text under ${OUT:-results}.
# Run from the repository root: bash benchmarks/h200_table.sh [shape...]   (default: all five shapes)
# Print the Markdown tables afterwards: python3 benchmarks/bench_moe.py --markdown "$OUT/table_<shape>.json" --pivot
set -u
START=$(date +%s)
OUT=${OUT:-results}; mkdir -p "$OUT"
if [ -d .whl ]; then  # wheels carried to a machine without an index (pytest and the like)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=$PWD:/tmp/site
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
BACKENDS=triton-dense,triton-fp8,triton-fp8-channel,triton-fp8-block,triton-nvfp4-w4a16
shapes=("$@"); [ ${#shapes[@]} -eq 0 ] && shapes=(mixtral qwen3 gpt-oss-120b qwen3-235b deepseek)
for shape in "${shapes[@]}"; do
  LEFT=$((${LIMIT_S:-575} - ($(date +%s) - START))); [ $LEFT -lt 20 ] && { echo "== out of time before $shape"; break; }
  echo "== $shape ${LEFT}s $(date +%T)"
  timeout $LEFT python3 benchmarks/bench_moe.py --shapes "$shape" --backends $BACKENDS --json "$OUT/table_$shape.json" \
    > "$OUT/table_$shape.txt" 2>&1
  grep -E "^  $shape T=" "$OUT/table_$shape.txt" | tail -8
done
echo "== done $(date +%T)"
