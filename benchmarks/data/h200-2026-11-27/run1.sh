#!/usr/bin/env bash
# The GPU suite's third run (one NVIDIA H200, 2026-11-27), first device command: the variants that decide defaults
# (the baseline is now cuDNN's attention with the seq-major projection; the old fused projection; the LM under XLA's
# attention, cuDNN's, and cuDNN's with seq-major), then `shardbench bench`. Run in the checkout's root with the
# wheels of docs/gpu-suite.md in .whl/; every result goes into $OUT/results.tar.gz.
# Usage: benchmarks/data/h200-2026-11-27/run1.sh COMMIT
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
finish() { tar czf "$OUT/results.tar.gz" -C "$R" . ; ls -la "$R"; }
trap finish EXIT
t=$SECONDS
"${G[@]}" --part variants-bf16 --budget-s 150 --case-timeout-s 80 \
  --cases "baseline,qkv fused,lm seq 1024 fused,lm seq 1024 cudnn,lm seq 1024 cudnn seq-major" 2>&1 | tee "$R/suite-variants.log"
echo "variants-bf16: $((SECONDS - t)) s" | tee -a "$R/times.txt"
t=$SECONDS; uptime | tee -a "$R/times.txt"
"${G[@]}" --part bench --budget-s 385 --case-timeout-s 390 2>&1 | tee "$R/suite-bench.log"
echo "bench: $((SECONDS - t)) s" | tee -a "$R/times.txt"
