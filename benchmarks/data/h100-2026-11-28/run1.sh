#!/usr/bin/env bash
# The GPU suite's fourth run (one NVIDIA H100, 2026-11-28), first device command: the profile of the new baseline
# (cuDNN's attention with the seq-major projection), whose reading under the kernel table the report's Profiles
# section shares; the XLA switches against that baseline; then vit-cifar on the real CIFAR-10 under the new default
# attention. Run in the checkout's root with the wheels of docs/gpu-suite.md in .whl/ and the CIFAR-10 tar at
# data/cifar10-jpeg.tar.gz; the results go into $OUT/results.tar.gz after each part.
# Usage: benchmarks/data/h100-2026-11-28/run1.sh COMMIT
set -u
COMMIT=$1 R=/tmp/r W=/tmp/w
mkdir -p "$R" "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
{ date -u; nvidia-smi; uptime; nproc
  python3 -c "import jax, flax, optax, torch, grain; print(jax.__version__, flax.__version__, optax.__version__, torch.__version__, grain.__version__, jax.devices())"
} > "$R/gpu.txt" 2>&1
cat "$R/gpu.txt"
G=(python3 benchmarks/gpu_suite.py --commit "$COMMIT" --out "$R" --work "$W")
finish() { tar czf "$OUT/results.tar.gz" -C "$R" . ; }
trap finish EXIT
part() {  # NAME LOG ARGS...: one part, its seconds in times.txt, the results packed after it
  local name=$1 log=$2 t=$SECONDS; shift 2
  uptime | tee -a "$R/times.txt"
  "${G[@]}" "$@" 2>&1 | tee "$R/$log"
  echo "$name: $((SECONDS - t)) s" | tee -a "$R/times.txt"
  finish
}
part profile suite-profile.log --part profile --budget-s 50 --case-timeout-s 80
part variants-bf16 suite-variants.log --part variants-bf16 --budget-s 185 --case-timeout-s 50 \
  --cases "baseline,command buffers,no command buffers,cudnn layernorm,cudnn gemm fusion,no triton gemm"
part accuracy suite-accuracy.log --part accuracy --recipe vit-cifar --budget-s 260 --case-timeout-s 290
