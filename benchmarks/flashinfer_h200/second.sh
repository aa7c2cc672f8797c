#!/bin/bash
# Later calls: second.sh WAIT_FOR(BUILD1_RC|BUILD2_RC) SECONDS PYTEST_K [bench_moe.py args...]
source .fi-h200/env.sh
mark=$1; lim=$2; k=$3; shift 3; s=$(date +%s)
while [ $(( $(date +%s) - s )) -lt $lim ]; do grep -q "$mark" $W/build.log 2>/dev/null && break; sleep 5; done
grep -v '^\[' $W/build.log | grep -v "^ *$" | tail -6
python3 -c "
import flashinfer
from moe_core.backends.flashinfer_trtllm_fp4.kernel import load_kernels as t
from moe_core.backends.flashinfer_cutlass.kernel import load_kernels as c
k = t(); print('flashinfer', flashinfer.__version__, 'trtllm optional keywords:', dict(k.routed_extra), dict(k.logits_extra), 'swiglu', k.swiglu, 'Renormalize', k.routing_methods['Renormalize'], 'cutlass swiglu', c().swiglu)"
[ "$k" != "-" ] && python3 -m pytest -q -p no:cacheprovider tests/test_flashinfer_gpu.py tests/test_kernel_models.py -k "$k" 2>&1 | tail -25
[ $# -gt 0 ] && python3 benchmarks/bench_moe.py "$@" 2>&1 | grep -v "^\[" | tail -60
ls $OUT
