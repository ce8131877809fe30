"""ZeRO-1 and ZeRO-2 as strategies: the placements they declare, the collectives their compiled step runs (counted
in its HLO by `shardbench.measure.comms`), what the planner compiles for them, and what pmap says of them.

The model: `mlp` with 16 inputs, width 64, 3 layers and 8 outputs (P = 9,928 float32 parameters, every array with
a dim 8 divides), on 8 simulated devices. Their equality with one device is `test_equivalence.py`'s, their memory
breakdown against a hand count `test_measure_memory.py`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import pytest
from jax.sharding import PartitionSpec as P

from shardbench import config as config_lib
from shardbench.errors import ConfigError
from shardbench.measure.comms import CommsReport, count_collectives
from shardbench.parallel.rules import make_layout
from shardbench.parallel.strategies import STRATEGIES, Largest
from shardbench.parsing import override
from shardbench.plan.candidates import USES, candidates
from shardbench.plan.compile import compile_candidate
from shardbench.preflight import check_run
from shardbench.presets import get_preset
from conftest import lowered_train_step

PARAMS = 16 * 64 + 64 + 2 * 64 * 64 + 2 * 64 + 64 * 8 + 8  # in, hidden (2 stacked) and out layers, with biases
GRAD_BYTES = 4 * PARAMS  # the float32 gradients of every parameter, whole
SCALARS = 64  # what an all-reduce of the step's scalars (loss, example count, gradient norm) may move


def _cfg(tmp_path: Path, strategy: str, spmd: str = "jit") -> config_lib.Config:
    return override(get_preset("mlp-small"), {
        "model.num_layers": 3, "model.mlp_dim": 64, "model.input_dim": 16, "model.num_classes": 8,
        "data.synthetic_train": 64, "data.synthetic_test": 32, "data.cache_dir": str(tmp_path / "cache"),
        "train.batch_size": 32, "train.progress": False, "train.eval": False, "train.out": str(tmp_path / "run"),
        "parallel.strategy": strategy, "parallel.mesh": "8", "parallel.devices": 8, "parallel.spmd": spmd})


def _lowered(cfg: config_lib.Config) -> Any:
    """`cfg`'s train step lowered on abstract state and batch."""
    return lowered_train_step(cfg)


def _collectives(cfg: config_lib.Config) -> CommsReport:
    """The collectives of `cfg`'s compiled train step."""
    return count_collectives(_lowered(cfg).compile().as_text())


def _bytes(report: CommsReport, kind: str) -> int:
    found = report.by_kind.get(kind)
    return 0 if found is None else found.bytes or 0


def test_zero_strategies_are_entries_of_placements() -> None:
    """zero1 and zero2 are dp's parameters and batch with their own optimizer (and gradient) tactics."""
    dp, zero1, zero2 = STRATEGIES["dp"], STRATEGIES["zero1"], STRATEGIES["zero2"]
    assert zero1.params == zero2.params == dp.params == () and zero1.compute == zero2.compute == dp.compute
    assert zero1.optimizer_tactics == zero2.optimizer_tactics == (Largest("data"),)
    assert zero1.gradient_tactics == () and zero2.gradient_tactics == (Largest("data"),)
    layout = make_layout("zero2", "8", jax.devices())
    axes, shape = ("layers", "embed", "mlp"), (2, 64, 64)
    assert layout.param_spec(axes, shape) == P(None, None, None)
    assert layout.optimizer_spec(axes, shape) == layout.gradient_spec(axes, shape) == P(None, "data", None)
    # Every other strategy keeps its optimizer state and gradients where its parameters are.
    fsdp = make_layout("fsdp", "8", jax.devices())
    assert fsdp.optimizer_spec(axes, shape) == fsdp.gradient_spec(axes, shape) == fsdp.param_spec(axes, shape)


@pytest.mark.slow
def test_zero2_reduce_scatters_the_gradients_and_gathers_the_parameters(tmp_path: Path) -> None:
    """ZeRO-2 written out (shard_map): the gradients reduce-scattered (each device sums only its slice), the
    updated slices all-gathered into whole parameters, and no all-reduce beyond the step's scalars."""
    comms = _collectives(_cfg(tmp_path, "zero2", "shard_map"))
    assert _bytes(comms, "reduce-scatter") == GRAD_BYTES, comms.by_kind
    assert _bytes(comms, "all-gather") == GRAD_BYTES, comms.by_kind  # the parameters, float32 like the gradients
    assert _bytes(comms, "all-reduce") <= SCALARS, comms.by_kind


@pytest.mark.slow
def test_zero2_under_jit_on_a_cpu_reduces_then_slices(tmp_path: Path) -> None:
    """Under jit XLA partitions the gradients' constraint itself: the CPU compiler writes it as an all-reduce
    of every gradient followed by each device's slice (it has no pass that turns the pair into a
    reduce-scatter, as the GPU and TPU compilers do), then all-gathers the updated parameters. This pins what
    the CPU figures of a jit ZeRO-2 run show; a compiler that forms the reduce-scatter fails it, and the
    docs' note on it is then out of date."""
    comms = _collectives(_cfg(tmp_path, "zero2", "jit"))
    assert _bytes(comms, "all-gather") == GRAD_BYTES, comms.by_kind
    assert "reduce-scatter" not in comms.by_kind and _bytes(comms, "all-reduce") >= GRAD_BYTES, comms.by_kind
    # What the step asks of the partitioner: each of the 6 gradients constrained to its slice over data, which
    # zero1's step (whole gradients) does not ask.
    asked = {s: _lowered(_cfg(tmp_path, s, "jit")).as_text().count("sdy.sharding_constraint")
             for s in ("zero1", "zero2")}
    assert asked["zero2"] - asked["zero1"] == 6, asked


@pytest.mark.slow
def test_zero2_written_out_holds_fewer_temporaries_than_zero1(tmp_path: Path) -> None:
    """Under shard_map the reduced gradients are slices, so the compiled step's temporaries shrink against
    zero1's (each device still differentiates into a whole local gradient before the reduce-scatter, which is
    why the saving is less than 7/8 of the gradients)."""
    temp = {s: _lowered(_cfg(tmp_path, s, "shard_map")).compile().memory_analysis().temp_size_in_bytes
            for s in ("zero1", "zero2")}
    assert temp["zero2"] < temp["zero1"], temp


@pytest.mark.slow
@pytest.mark.parametrize("spmd", ["jit", "shard_map"])
def test_zero1_reduces_whole_gradients_and_gathers_the_parameters(tmp_path: Path, spmd: str) -> None:
    """ZeRO-1 keeps whole gradients: they are all-reduced as dp's are (never reduce-scattered into slices, as
    zero2's), and the parameters, updated in slices by the sharded optimizer state, are all-gathered after the
    update."""
    comms = _collectives(_cfg(tmp_path, "zero1", spmd))
    dp = _collectives(_cfg(tmp_path, "dp", spmd))
    assert _bytes(comms, "all-gather") == GRAD_BYTES, comms.by_kind
    assert "reduce-scatter" not in comms.by_kind, comms.by_kind
    assert GRAD_BYTES <= _bytes(comms, "all-reduce") <= GRAD_BYTES + SCALARS, comms.by_kind
    assert "all-gather" not in dp.by_kind and _bytes(dp, "all-reduce") >= GRAD_BYTES, dp.by_kind
    if spmd == "jit":  # the CPU compiler writes zero2's slicing as an all-reduce too: what the step asks is
        # where they differ. zero1 constrains no gradient to a slice, so it asks the partitioner what dp asks.
        asked = {s: _lowered(_cfg(tmp_path, s, "jit")).as_text().count("sdy.sharding_constraint")
                 for s in ("dp", "zero1")}
        assert asked["zero1"] == asked["dp"], asked


@pytest.mark.slow
def test_the_planner_compiles_zero_with_its_gradient_bytes(tmp_path: Path) -> None:
    """The planner's candidates include zero1 and zero2 on every data mesh, and its compiled figures count the
    gradients where the strategy puts them."""
    found = {(c.strategy, c.mesh) for c in candidates(8, 32, list(USES), ["none"], ["float32"])}
    assert {("zero1", "8x1"), ("zero2", "8x1")} <= found
    figures: dict[str, Any] = {s: compile_candidate(_cfg(tmp_path, s), 8)["state"] for s in ("zero1", "zero2")}
    assert figures["zero1"]["gradients_bytes"] == GRAD_BYTES
    assert figures["zero2"]["gradients_bytes"] == GRAD_BYTES // 8
    assert figures["zero1"]["params_bytes"] == figures["zero2"]["params_bytes"] == GRAD_BYTES


@pytest.mark.parametrize("strategy", ["zero1", "zero2"])
def test_pmap_refuses_zero_in_one_line(tmp_path: Path, strategy: str) -> None:
    with pytest.raises(ConfigError, match=rf"--spmd pmap replicates .* cannot run --strategy {strategy}") as err:
        check_run(_cfg(tmp_path, strategy, "pmap"))
    assert "\n" not in str(err.value)
