#!/bin/bash
# Detached on the GPU machine: the pruned fused_moe_90 build, bf16 TUs (then fp8 ones with FI_FP8=1). Log: /tmp/fiws/build.log
cd "$(dirname "$0")/.."; source .fi-h200/env.sh
{ s=$(date +%s); FI_STAGE=bf16 python3 $R/fi_build.py; echo "BUILD1_RC=$? wall=$(( $(date +%s) - s ))s"
  if [ "${FI_FP8:-0}" = 1 ]; then FI_STAGE=all python3 $R/fi_build.py; echo "BUILD2_RC=$? wall=$(( $(date +%s) - s ))s"; fi
  echo BUILD_DONE; } > $W/build.log 2>&1
