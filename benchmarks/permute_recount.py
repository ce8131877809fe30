"""Recount the collective-permutes of committed runs: each run folder's train step is compiled again from its
config.json (nothing is trained), and one JSON line a run gives its stage-to-stage permutes as the run recorded
them (`measurements.pipeline_transfers`: payloads, which records from before the fix of collective-permute bytes
sent also gave as bytes sent) beside today's count: the payload, the bytes the fullest device sends (a permute is
sent by its source devices alone), and the bytes all devices send together.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \\
        python benchmarks/permute_recount.py benchmarks/data/pipeline-cpu/runs/*stage_8* \\
        > benchmarks/data/pipeline-cpu/permute-recount.jsonl

The figures under the tables of benchmarks/pipeline-cpu.md and docs/parallelism.md come from that output.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from shardbench.parsing import from_dict, override
from shardbench.plan.compile import compile_candidate


def recount(folder: Path, scratch: Path) -> dict[str, object]:
    """One run folder's stage-to-stage permutes, recorded and recounted (`compile_candidate` compiles, as the
    planner does, for the run's own devices on this host)."""
    cfg = from_dict(json.loads((folder / "config.json").read_text()))
    cfg = override(cfg, {"data.cache_dir": str(scratch / "cache"), "train.out": str(scratch / folder.name)})
    result = compile_candidate(cfg, cfg.parallel.devices)
    stage = [c for c in result["collectives"] if c["kind"] == "collective-permute" and c["stage"]]
    recorded = json.loads((folder / "summary.json").read_text())["measurements"].get("pipeline_transfers")
    return {"run": folder.name, "recorded": recorded,
            "count": sum(c["count"] for c in stage), "payload": sum(c["bytes"] for c in stage),
            "fullest_sent": sum(c["sent"] for c in stage), "all_sent": sum(c["sent_all"] for c in stage)}


def main(folders: list[str]) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        for folder in map(Path, folders):
            if (folder / "summary.json").exists():
                print(json.dumps(recount(folder, Path(scratch))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
