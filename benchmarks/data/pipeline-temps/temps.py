"""XLA's temporary bytes per device of the compiled train step under each pipeline schedule, on the case of
tests/test_pipeline.py::test_1f1b_keeps_fewer_activations_than_gpipe (mlp, width 64, 8 stacked layers, 2 stages,
8 microbatches of 64 rows, Adam; 8 simulated CPU devices, the tests' XLA flags).

    cd tests && ../.venv/bin/python ../benchmarks/data/pipeline-temps/temps.py
"""
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))
import conftest  # noqa: F401,E402 - the tests' XLA flags and 8 devices, before JAX starts
import test_pipeline  # noqa: E402
from conftest import lowered_train_step  # noqa: E402

tmp = Path(tempfile.mkdtemp())
for schedule, repeats in (("gpipe", 1), ("1f1b", 1), ("circular", 2)):
    cfg = test_pipeline._cfg(tmp, "pp", "stage=2", 2, 8, **{
        "model.num_layers": 9, "train.batch_size": 512, "data.synthetic_train": 1024,
        "parallel.schedule": schedule, "parallel.repeats": repeats})
    temp = lowered_train_step(cfg).compile().memory_analysis().temp_size_in_bytes
    print(f"{schedule} (repeats {repeats}): {temp:,} bytes")
