#!/usr/bin/env bash
# CPU seconds (user + system) and wall seconds of short `shardbench` commands, two source trees side by side:
# each command run REPEATS times, the trees alternating, so that both meet the same host.
#     bash benchmarks/data/cli-startup/measure.sh BEFORE/src AFTER/src [REPEATS]
# Each tree's bytecode is written first (as `make test` does). The commands run as the tests' processes do:
# JAX_PLATFORMS=cpu and 8 simulated devices; a train of 20 steps re-executes itself for the tuned allocator.
set -euo pipefail
before=$1 after=$2 repeats=${3:-5}
python=${PYTHON:-.venv/bin/python}
export JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=8
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for src in "$before" "$after"; do "$python" -m compileall -q "$src"; done
commands=(
  "presets"
  "train --help"
  "train --steps -1"
  "train --model.kind cnn"
  "inspect --strategy xp"
  "plan --preset mlp-small --target 8xh900 --out OUT"
  "plan --preset mlp-small --target 8xh100 --candidates dp,fsdp --batch-size 12 --out OUT"
  "train --preset vit-tiny --model.attention cudnn --dtype float32"
  "train --preset mlp-small --devices 1 --steps 20 --batch-size 32 --no-train.eval --data.synthetic-train 256 --out OUT"
)
echo "# $(date -u '+%Y-%m-%d %H:%M UTC') $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores"
echo "# before: $before ($(git -C "$before" rev-parse --short HEAD 2>/dev/null || echo '?'))  after: $after"
printf '%-108s %-6s %4s %7s %7s\n' command tree rc cpu_s wall_s
for command in "${commands[@]}"; do
  for i in $(seq "$repeats"); do
    for tree in before after; do
      src=$before; [ "$tree" = after ] && src=$after
      out="$work/out-$tree-$i-$RANDOM"
      rc=0
      /usr/bin/time -f '%U %S %e' -o "$work/time" env PYTHONPATH="$src" "$python" -m shardbench \
        ${command//OUT/$out} >/dev/null 2>"$work/err" || rc=$?
      read -r user sys wall < <(tail -1 "$work/time")
      printf '%-108s %-6s %4s %7.2f %7.2f\n' "$command" "$tree" "$rc" "$(echo "$user + $sys" | bc)" "$wall"
    done
  done
done
