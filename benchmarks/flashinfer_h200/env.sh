# Sourced on the GPU machine: flashinfer in /tmp/site, its JIT workspace, nvrtc and header fallbacks (as run_all.sh).
W=/tmp/fiws; mkdir -p $W; R=$PWD/.fi-h200
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FLASHINFER_WORKSPACE_BASE=$W
NVCC=$(which nvcc); CH=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
EXTRA=""
for h in cublasLt.h curand_kernel.h nvrtc.h; do [ -f "$CH/include/$h" ] || EXTRA="-isystem $R/cuhdr"; done
export FLASHINFER_EXTRA_CUDAFLAGS="$EXTRA" FLASHINFER_EXTRA_CFLAGS="$EXTRA"
if ! ls "$CH"/lib64/libnvrtc.so >/dev/null 2>&1; then
  L=$(python3 -c "import glob,site;print((glob.glob(site.getsitepackages()[0]+'/nvidia/cu13/lib/libnvrtc.so.1*')+[''])[0])")
  mkdir -p /tmp/nvrtclink && ln -sf "$L" /tmp/nvrtclink/libnvrtc.so
  export FLASHINFER_EXTRA_LDFLAGS="-L/tmp/nvrtclink" LD_LIBRARY_PATH="$(dirname "$L"):${LD_LIBRARY_PATH:-}"
fi
