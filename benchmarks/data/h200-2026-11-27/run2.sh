#!/usr/bin/env bash
# The third GPU run's second device command, on the machine the first left warm: the planner's sweep of vit-seed
# (batch 512 and 2048, float32 and bfloat16), whose run records `plan --validate` then reads on any machine.
# Usage: benchmarks/data/h200-2026-11-27/run2.sh COMMIT
set -u
COMMIT=$1 R=/tmp/r2 W=/tmp/w2
mkdir -p "$R" "$W"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
finish() { tar czf "$OUT/results2.tar.gz" --exclude='checkpoints' --exclude='*tfevents*' -C "$R" . -C "$W" plan-sweep; ls -la "$R"; }
trap finish EXIT
t=$SECONDS
python3 benchmarks/gpu_suite.py --commit "$COMMIT" --out "$R" --work "$W" --part plan --cases sweep \
  --budget-s 185 --case-timeout-s 190 2>&1 | tee "$R/suite-plan.log"
echo "plan sweep: $((SECONDS - t)) s" | tee -a "$R/times.txt"
