#!/bin/bash
# First call: install the carried wheels, start the build detached, report moe-core info, wait for the bf16 module.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .fi-h200/whl/*.whl || exit 1
source .fi-h200/env.sh
python3 -c "import flashinfer, torch; print('flashinfer', flashinfer.__version__, 'torch', torch.__version__, 'cap', torch.cuda.get_device_capability())"
setsid nohup bash .fi-h200/build.sh > $W/nohup.log 2>&1 < /dev/null &
python3 -c "
import sys
import moe_core.backends.reference, moe_core.backends.triton, moe_core.backends.flashinfer_cutlass, moe_core.backends.flashinfer_trtllm_fp4
from moe_core.cli import main
sys.exit(main(['info', '--device', 'cuda']))" > $OUT/info_h200.txt 2>&1; echo "info rc=$?"; cat $OUT/info_h200.txt

lim=${1:-480}; s=$(date +%s)
while [ $(( $(date +%s) - s )) -lt $lim ]; do grep -q "BUILD1_RC\|BUILD_DONE" $W/build.log 2>/dev/null && break; sleep 5; done
grep -v '^\[' $W/build.log | tail -8; grep -c '^\[' $W/build.log; cp $W/build.log $OUT/ 2>/dev/null
