#!/usr/bin/env bash
# Expert parallelism on NCCL, one GPU per rank, in one command: the multi-process tests at every world size the GPUs
# allow (WORLD_SIZES, default: 2, 4 and 8 where there are that many GPUs, else all of them), then the dispatch and
# combine timings on all GPUs. Run from the repository root on a machine with torch and its GPUs:
#     bash benchmarks/ep_multi_gpu.sh [extra ep_bench.py flags]
set -euo pipefail
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
if [ -z "${WORLD_SIZES:-}" ]; then
    WORLD_SIZES=$(python3 -c "g=$gpus; print(','.join(str(w) for w in (2, 4, 8) if w <= g) or str(g))")
fi
echo "NCCL over $gpus GPUs; world sizes $WORLD_SIZES"
MOE_CORE_DIST_BACKEND=nccl MOE_CORE_DIST_WORLD_SIZES=$WORLD_SIZES \
    python3 -m pytest -q -p no:cacheprovider tests/test_distributed_worlds.py
python3 benchmarks/ep_bench.py --backend nccl "$@"
