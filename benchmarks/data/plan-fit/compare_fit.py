"""The planner's fit before and after its least squares were solved for many trials at once (compare-0844.txt:
every trial of the grid at once, commit 1908856; compare-1028.txt: a chunk of FIT_CHUNK trials at a time, as
shipped): the same random sample sets (seeded), each fitted by both; prints each fit's seconds and whether the
coefficients are equal.

    git show 246d681:src/shardbench/plan/calibration.py > /tmp/old_calibration.py
    PYTHONPATH=src .venv/bin/python benchmarks/data/plan-fit/compare_fit.py /tmp/old_calibration.py
"""
import importlib.util, sys, time, random
spec=importlib.util.spec_from_file_location("old_cal",sys.argv[1]); old=importlib.util.module_from_spec(spec); sys.modules["old_cal"]=old; spec.loader.exec_module(old)
from shardbench.plan import calibration as new
from shardbench.plan.steptime import StepFeatures
rng=random.Random(0)
diffs=0
for case in range(6):
    samples=[]
    for i in range(rng.randint(4,12)):
        f=StepFeatures(compute_s=rng.uniform(1e-4,1e-1), traffic_s=rng.uniform(1e-4,1e-1), kernels=float(rng.randint(10,900)),
                       collectives=float(rng.randint(0,40)) if case%2 else 0.0, link_s={"intra": rng.uniform(0,1e-3) if case%2 else 0.0, "inter":0.0},
                       low_precision=(case>=3 and i%2==1))
        samples.append((f, rng.uniform(1e-3,0.5)))
    for b in list(new.DEFAULTS.values())[:2]:
        t=time.perf_counter(); a=old.fit(samples,b,"x"); t1=time.perf_counter(); c=new.fit(samples,b,"x"); t2=time.perf_counter()
        same = a==c
        if not same:
            diffs+=1; print("DIFF", case, a, c)
        print(case, len(samples), any(f.low_precision for f,_ in samples), f"old {t1-t:.2f}s new {t2-t1:.2f}s", "same" if same else "")
print("diffs", diffs)
