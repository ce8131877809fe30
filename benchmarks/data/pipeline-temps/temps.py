"""XLA's temporary bytes per device of the compiled train step under each pipeline schedule, on the case of
tests/test_pipeline.py::test_1f1b_keeps_fewer_activations_than_gpipe (mlp, width 64, 16 stacked layers, 2 stages,
microbatches of 64 rows, Adam; 8 simulated CPU devices, the tests' XLA flags): each schedule at 8 microbatches,
and 1F1B and GPipe at 32, to show what each adds per microbatch.

    cd tests && ../.venv/bin/python ../benchmarks/data/pipeline-temps/temps.py
"""
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))
import conftest  # noqa: F401,E402 - the tests' XLA flags and 8 devices, before JAX starts
import test_pipeline  # noqa: E402
from conftest import lowered_train_step  # noqa: E402

ROWS = 64
tmp = Path(tempfile.mkdtemp())
temps = {}
for schedule, repeats, m in (("gpipe", 1, 8), ("1f1b", 1, 8), ("circular", 2, 8), ("1f1b", 1, 32), ("gpipe", 1, 32)):
    cfg = test_pipeline._cfg(tmp, "pp", "stage=2", 2, m, **{
        "model.num_layers": 17, "train.batch_size": ROWS * m, "data.synthetic_train": 2 * ROWS * m,
        "parallel.schedule": schedule, "parallel.repeats": repeats})
    temps[schedule, m] = lowered_train_step(cfg).compile().memory_analysis().temp_size_in_bytes
    print(f"{schedule} (repeats {repeats}), {m} microbatches: {temps[schedule, m]:,} bytes", flush=True)
one_microbatch = ROWS * test_pipeline.WIDTH * 4
for schedule in ("1f1b", "gpipe"):
    added = (temps[schedule, 32] - temps[schedule, 8]) / (32 - 8) / one_microbatch
    print(f"{schedule}: each added microbatch adds {added:.2f} arrays of one microbatch x width "
          f"({one_microbatch:,} bytes)")
