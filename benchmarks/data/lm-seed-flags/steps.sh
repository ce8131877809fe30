#!/bin/bash
# The loss-floor test's run (tests/test_models_spmd.py::test_lm_seed_on_uniform_tokens_approaches_but_never_beats_ln512:
# lm-seed, 20 steps, one CPU device) with XLA's defaults and with the tests' quick-compile flags
# (tests/conftest.py's QUICK_COMPILE_FLAGS), taking turns, twice; prints each run's median step and compile time.
# Run from the checkout: bash benchmarks/data/lm-seed-flags/steps.sh
QUICK="--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
work=$(mktemp -d)
for round in 1 2; do for flags in default quick; do
  out=$work/$flags-$round
  x=""; [ $flags = quick ] && x=$QUICK
  XLA_FLAGS="$x" JAX_PLATFORMS=cpu .venv/bin/python -m shardbench train --preset lm-seed --model.embed-dim 256 \
    --model.num-heads 8 --model.mlp-dim 1024 --model.num-layers 4 --model.seq-len 64 --data.synthetic-train 8192 \
    --data.synthetic-test 256 --data.val-fraction 0.02 --steps 20 --mesh none --no-train.progress \
    --train.checkpoint-every 0 --train.log-every 1 --optim.warmup-steps 0 --out $out --data.cache-dir $work/cache \
    > /dev/null 2>&1 || { echo "$flags $round failed"; continue; }
  python3 -c "
import json; m = json.load(open('$out/summary.json'))['measurements']
print('$flags', $round, 'median step', round(m['step_time_s']['median'] * 1e3, 1), 'ms; compile',
      round(m['compile']['compile_s'], 2), 's')"
done; done
rm -rf "$work"
