#!/bin/bash
OUT=${OUT:-/tmp/ab}; mkdir -p "$OUT"
cd "$(dirname "$0")/../../../.."
run() { XLA_FLAGS="$2" /usr/bin/time -f "$1 user %U sys %S wall %e" .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_moe.py tests/test_context_equivalence.py > $OUT/out-$1-$3 2>&1; tail -2 $OUT/out-$1-$3; }
for r in 1 2; do
run base "" $r
run split1 "--xla_cpu_parallel_codegen_split_count=1" $r
run both "--xla_cpu_parallel_codegen_split_count=1 --xla_cpu_multi_thread_eigen=false" $r
done
