# What tune's docs say planning and a run's start cost (docs/tune.md), measured; <scratch>, <out> and <cache> are
# folders of your own. Run: bash costs.sh > costs-DATE.txt 2>&1 (after replacing them).
set -u
cd <scratch>
SB=<checkout>/.venv/bin/shardbench
echo "# sections 1-3: each command with a fresh SHARDBENCH_CACHE (no compiled program cached); section 4 reuses section 3's"
echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc) cores"
echo "## 1. tune's default space on mlp-small, 8 devices, one compile worker, one 5-step run measured"
echo "\$ shardbench tune --preset mlp-small --devices 8 --workers 1 --top-k 1 --measure-steps 5 --budget-min 5 --out <out>/tune-mlp"
SHARDBENCH_CACHE=<cache>-tune /usr/bin/time -f "wall %e s, user %U s, sys %S s" $SB tune --preset mlp-small --devices 8 --workers 1 --top-k 1 --measure-steps 5 --budget-min 5 --out <out>/tune-mlp 2>&1
for p in vit-tiny lm-tiny mlp-small; do
  echo "## 2. planning cost per compilation: $p, dp, fsdp and zero1 on 8 CPU devices, one worker"
  echo "\$ shardbench plan --preset $p --target cpu --devices 8 --workers 1 --candidates dp,fsdp,zero1 --remat none --out <out>/plan-$p"
  SHARDBENCH_CACHE=<cache>-$p $SB plan --preset $p --target cpu --devices 8 --workers 1 --candidates dp,fsdp,zero1 --remat none --out <out>/plan-$p 2>&1 | grep -E "candidate\(s\)|^plan for"
done
echo "## 3. a lone 5-step run of mlp-small on 8 devices: wall time against its compile and steps"
echo "\$ shardbench train --preset mlp-small --devices 8 --steps 5 --out <out>/train-mlp"
SHARDBENCH_CACHE=<cache>-train /usr/bin/time -f "wall %e s, user %U s, sys %S s" $SB train --preset mlp-small --devices 8 --steps 5 --out <out>/train-mlp 2>&1 | tail -2
<checkout>/.venv/bin/python - <<'PY'
import json
s = json.load(open("<out>/train-mlp/summary.json"))
m = s["measurements"]
print("compile:", json.dumps(m.get("compile")), "| step_time_s:", json.dumps(m.get("step_time_s")))
PY
echo "# done $(date -u +%FT%TZ)"
echo "## 4. the same lone run again with that cache (the host's peak and the program cached): what remains is the start"
echo "\$ shardbench train --preset mlp-small --devices 8 --steps 5 --out <out>/train-mlp-again"
SHARDBENCH_CACHE=<cache>-train /usr/bin/time -f "wall %e s, user %U s, sys %S s" $SB train --preset mlp-small --devices 8 --steps 5 --out <out>/train-mlp-again 2>&1 | tail -2
echo "# done $(date -u +%FT%TZ)"
