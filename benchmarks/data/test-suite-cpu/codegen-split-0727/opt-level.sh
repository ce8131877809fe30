#!/bin/bash
# One 4-step vit-tiny fsdp training on 8 simulated devices with the tests' XLA flags, then at -O1 and -O2 (the later
# flag wins), taking turns: each line is the label, user and system CPU seconds, wall seconds, and the run record's
# compile and lower seconds. Run from the checkout's root.
out=$(mktemp -d)
run() {
  XLA_FLAGS="--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 \
--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1 $2" JAX_PLATFORMS=cpu \
  SHARDBENCH_CACHE=$out/cache /usr/bin/time -f "$1 %U %S %e" .venv/bin/python -m shardbench train --preset vit-tiny \
    --steps 4 --batch-size 32 --data synthetic --data.synthetic-train 256 --data.synthetic-test 64 \
    --no-train.progress --strategy fsdp --train.compile-cache off --out $out/run >/dev/null 2>$out/err
  echo "$(tail -1 $out/err) compile $(python3 -c "import json;print(json.load(open('$out/run/summary.json'))['measurements']['compile'])")"
  rm -rf $out/run
}
for r in 1 2; do run s1 ""; run O2 "--xla_backend_optimization_level=2"; run O1 "--xla_backend_optimization_level=1"; done
