"""Each part of the memory breakdown against a count made independently of the code that measures it: the
parameters', optimizer state's and gradients' bytes by hand from the MLP's shapes, dtypes and layout per device,
the activations against XLA's own temporaries, and the rest against the batch and the step's outputs.

The model: `mlp` with 16 inputs, width 64, 3 layers (one input layer, 2 stacked square ones) and 8 outputs.
Every dim a layout splits is a multiple of 8, so each parameter divides evenly over 8 devices."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from shardbench import config as config_lib
from shardbench.measure.collect import (
    Clocks,
    CompiledStep,
    RunSetup,
    build_measurements,
)
from shardbench.measure.comms import count_collectives
from shardbench.measure.memory import gradient_buffers, memory_report
from shardbench.measure.run_record import Memory
from shardbench.measure.timing import StepTimer, compile_timed
from shardbench.parallel.mesh import DATA
from shardbench.parsing import override
from shardbench.presets import get_preset
from shardbench.tasks import get_task
from shardbench.optim import build_optimizer
from shardbench.preflight import check_run
from shardbench.train.loop import run
from shardbench.train.spmd import make_steps
from shardbench.train.state import init_state

INPUTS, WIDTH, DEPTH, OUTPUTS, BATCH = 16, 64, 2, 8, 32
# Element counts by parameter: in_kernel, in_bias, hidden_kernel (stacked), hidden_bias, out_kernel, out_bias.
ELEMENTS = {"in_kernel": INPUTS * WIDTH, "in_bias": WIDTH, "hidden_kernel": DEPTH * WIDTH * WIDTH,
            "hidden_bias": DEPTH * WIDTH, "out_kernel": WIDTH * OUTPUTS, "out_bias": OUTPUTS}
PARAMS = 16 * 64 + 64 + 2 * 64 * 64 + 2 * 64 + 64 * 8 + 8
# tp over a model axis of 8 splits the 'mlp' dim: every parameter but the output layer's.
TP_SPLIT = {"in_kernel", "in_bias", "hidden_kernel", "hidden_bias"}
# optax's Adam keeps one int32 step count, and the learning-rate schedule another: both replicated.
ADAM_COUNTERS = 2 * 4
STEP_COUNTER = 4  # the train state's own int32 step, an argument of the compiled step
METRICS = 3 * 4  # loss, gradient norm and learning rate, float32 scalars (a regression has no accuracy)
# The CPU compiler counts the output tuple's table among the outputs: one 8-byte pointer per output, here the
# state's 21 arrays (6 parameters, 2 x 6 moments, 2 optimizer counters and the step) and the 3 metrics.
OUTPUT_TABLE = (6 + 2 * 6 + 2 + 1 + 3) * 8


def _cfg(tmp_path: Any, **overrides: object) -> config_lib.Config:
    cfg = get_preset("mlp-small")
    return override(cfg, {
        "model.num_layers": DEPTH + 1, "model.mlp_dim": WIDTH, "model.input_dim": INPUTS,
        "model.num_classes": OUTPUTS, "data.synthetic_train": 256, "data.synthetic_test": 64,
        "data.cache_dir": str(tmp_path / "cache"), "train.batch_size": BATCH, "train.steps": 3,
        "train.progress": False, "train.eval": False, "train.out": str(tmp_path / "run"), **overrides})


def _built(cfg: config_lib.Config) -> tuple[Any, Any, Any, Any]:
    """(checked run, state, compiled train step, compile times)."""
    plan = check_run(cfg)
    tx = build_optimizer(cfg.optim, 10)
    state = init_state(cfg, plan.spec, plan.layout, tx)
    steps = make_steps(cfg, get_task(cfg), plan.spec, plan.layout, tx, ("inputs", "targets"))
    rows = cfg.train.batch_size
    batch = {"inputs": np.zeros((rows, INPUTS), np.float32), "targets": np.zeros((rows, OUTPUTS), np.float32),
             "mask": np.ones(rows, bool)}
    compiled, times = compile_timed(steps.train, state, steps.place(batch))
    return plan, state, compiled, times


def _report(cfg: config_lib.Config, gradients: Any = None) -> tuple[Memory, Any]:
    plan, state, compiled, _ = _built(cfg)
    grads = gradient_buffers(state.params) if gradients is None else gradients(state, plan.layout)
    devices = [plan.layout.device] if plan.layout.mesh is None else list(plan.layout.mesh.devices.flat)
    return memory_report(compiled, state.params, state.opt_state, devices, gradients=grads,
                         model_state=state.model_state), compiled


def _per_device(divide: dict[str, int], itemsize: int) -> int:
    """Bytes one device holds of the parameters when parameter `name` is split `divide[name]` ways."""
    return sum(n // divide.get(name, 1) for name, n in ELEMENTS.items()) * itemsize


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "mesh", "divide"), [
    ("dp", "8", {}),
    ("fsdp", "8", {name: 8 for name in ELEMENTS}),
    ("tp", "1x8", {name: 8 for name in TP_SPLIT}),
])
def test_parameter_optimizer_and_gradient_bytes_match_a_hand_count(tmp_path, strategy: str, mesh: str,
                                                                   divide: dict[str, int]) -> None:
    assert sum(ELEMENTS.values()) == PARAMS == 9928
    memory, _ = _report(_cfg(tmp_path, **{"parallel.strategy": strategy, "parallel.mesh": mesh}))
    params = _per_device(divide, 4)
    b = memory.breakdown
    assert b.params_bytes == params
    assert b.optimizer_bytes == 2 * params + ADAM_COUNTERS  # Adam's two float32 moments
    assert b.gradients_bytes == params  # float32, laid out like the parameters by every strategy's step
    assert b.model_state_bytes == 0


@pytest.mark.slow
@pytest.mark.parametrize(("param_dtype", "mu_dtype", "param_bytes", "mu_bytes"), [
    ("bfloat16", "", 2, 2),  # optax keeps both moments in the parameters' dtype
    ("float32", "bfloat16", 4, 2),  # --optim.mu-dtype halves the first moment only
])
def test_mixed_precision_counts_each_buffer_in_its_own_dtype(tmp_path, param_dtype: str, mu_dtype: str,
                                                            param_bytes: int, mu_bytes: int) -> None:
    memory, _ = _report(_cfg(tmp_path, **{"parallel.strategy": "fsdp", "parallel.mesh": "8",
                                          "precision.param_dtype": param_dtype, "optim.mu_dtype": mu_dtype}))
    per_device = PARAMS // 8
    b = memory.breakdown
    assert b.params_bytes == per_device * param_bytes
    assert b.optimizer_bytes == per_device * (mu_bytes + param_bytes) + ADAM_COUNTERS  # the second moment: params'
    assert b.gradients_bytes == per_device * param_bytes  # a gradient has its parameter's dtype


def _sharded_over_data(state: Any, layout: Any) -> Any:
    """Gradients split over the data axis along their last dim while the parameters stay replicated: the
    layout ZeRO-2 gives them."""
    def one(p: jax.Array) -> NamedSharding:
        return NamedSharding(layout.mesh, PartitionSpec(*([None] * (p.ndim - 1)), DATA))

    return gradient_buffers(state.params, jax.tree.map(one, state.params))


@pytest.mark.slow
def test_gradients_are_counted_from_their_own_buffers_not_the_parameters(tmp_path) -> None:
    memory, _ = _report(_cfg(tmp_path, **{"parallel.strategy": "dp", "parallel.mesh": "8"}), _sharded_over_data)
    b = memory.breakdown
    assert b.params_bytes == PARAMS * 4  # replicated
    assert b.gradients_bytes == PARAMS * 4 // 8  # every last dim (64 or 8) splits over 8 devices


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "mesh", "divide"), [("dp", "8", {}), ("fsdp", "8", {n: 8 for n in ELEMENTS})])
def test_activations_are_xlas_temporaries_beyond_the_gradients_and_the_rest_is_batch_and_metrics(
        tmp_path, strategy: str, mesh: str, divide: dict[str, int]) -> None:
    memory, compiled = _report(_cfg(tmp_path, **{"parallel.strategy": strategy, "parallel.mesh": mesh}))
    xla = compiled.memory_analysis()  # asked here, not through the module under test
    gradients = _per_device(divide, 4)
    b = memory.breakdown
    assert xla.temp_size_in_bytes > gradients  # the temporaries hold the gradients and more
    assert b.activations_temporaries_bytes == xla.temp_size_in_bytes - gradients
    rows = BATCH // 8
    batch = rows * INPUTS * 4 + rows * OUTPUTS * 4  # inputs and targets, float32 (the mask is unused: pruned)
    assert b.other_bytes == STEP_COUNTER + batch + METRICS + OUTPUT_TABLE
    assert memory.total_bytes == (xla.argument_size_in_bytes + xla.output_size_in_bytes
                                  - xla.alias_size_in_bytes + xla.temp_size_in_bytes)


@pytest.mark.slow
def test_the_recorded_breakdown_is_the_hand_count(tmp_path) -> None:
    """Through `build_measurements`, as a run records it: the state's parts and the gradients by hand."""
    cfg = _cfg(tmp_path, **{"parallel.strategy": "fsdp", "parallel.mesh": "8", "precision.param_dtype": "bfloat16"})
    plan, state, compiled, times = _built(cfg)
    m = build_measurements(RunSetup(cfg, plan.task, plan.layout), CompiledStep(compiled, times),
                           Clocks(StepTimer(), [], [], plan.steps_per_epoch, 0), state)
    b = m.memory.breakdown
    per_device = PARAMS // 8
    assert (b.params_bytes, b.gradients_bytes, b.optimizer_bytes) == (
        per_device * 2, per_device * 2, per_device * 2 * 2 + ADAM_COUNTERS)  # Adam's moments in the params' dtype
    assert m.compile is times and m.memory.per_device[0]["params_bytes"] == per_device * 2


@pytest.mark.slow
def test_accumulation_holds_one_microbatchs_activations(tmp_path) -> None:
    """The same global batch (512 rows per device under dp) in one pass and in 4 microbatches of 128: XLA's
    temporaries beyond the gradients and accumulation's float32 accumulator (one more parameter-sized buffer)
    are one microbatch's activations, about a quarter of the whole batch's."""
    temps = {}
    for k in (1, 4):
        cfg = _cfg(tmp_path, **{"parallel.strategy": "dp", "parallel.mesh": "8", "train.batch_size": 4096,
                                "train.grad_accum": k, "data.synthetic_train": 4608})
        temps[k] = _built(cfg)[2].memory_analysis().temp_size_in_bytes
    gradients = PARAMS * 4
    whole, micro = temps[1] - gradients, temps[4] - 2 * gradients
    assert whole > 10 * gradients  # the batch's activations dominate, so a saving shows
    # Measured (jax 0.10, CPU): 931,304 bytes in one pass, 287,048 in four microbatches (0.31: the microbatches'
    # inputs, split from the whole batch, are the rest).
    assert micro < 0.4 * whole, temps


@pytest.mark.slow
def test_accumulation_reduces_the_gradients_once_per_update_under_shard_map_and_per_microbatch_under_jit(
        tmp_path) -> None:
    """What accumulation costs in communication, counted in the compiled program: shard_map's written-out
    reduction runs once per update whatever K; under jit XLA reduces each microbatch's gradients (inside the
    loop: K times the bytes), which docs/training.md says."""
    def reduced(style: str, k: int) -> tuple[int | None, int | None]:
        cfg = _cfg(tmp_path, **{"parallel.strategy": "dp", "parallel.mesh": "8", "parallel.spmd": style,
                                "train.grad_accum": k})
        found = count_collectives(_built(cfg)[2].as_text()).by_kind["all-reduce"]
        return found.count, found.bytes

    once = reduced("shard_map", 1)
    assert once[1] >= PARAMS * 4  # the gradients, all-reduced
    assert reduced("shard_map", 4) == once
    assert reduced("jit", 4) == (4 * once[0], 4 * once[1])


@pytest.mark.parametrize("spmd", ["jit", "shard_map"])
@pytest.mark.parametrize(("strategy", "params", "gradients", "optimizer"), [
    # PARALLELISM.md's count per device for P float32 parameters, Adam's two moments and N = 8 devices: every
    # array of this MLP has a dim 8 divides, so each split is exact.
    ("dp", 4 * PARAMS, 4 * PARAMS, 8 * PARAMS),  # replicated: 16P
    ("zero1", 4 * PARAMS, 4 * PARAMS, 8 * PARAMS // 8),  # 4P + 4P + 8P/N
    ("zero2", 4 * PARAMS, 4 * PARAMS // 8, 8 * PARAMS // 8),  # 4P + (4P + 8P)/N
    ("fsdp", 4 * PARAMS // 8, 4 * PARAMS // 8, 8 * PARAMS // 8),  # 16P/N
])
def test_zero_breakdown_is_the_hand_count(tmp_path, spmd: str, strategy: str, params: int, gradients: int,
                                          optimizer: int) -> None:
    """Through a whole run, as summary.json records it: each part's bytes per device for ZeRO-1, ZeRO-2 and
    the replicated and fully sharded layouts they sit between."""
    summary = run(_cfg(tmp_path, **{"parallel.strategy": strategy, "parallel.mesh": "8", "parallel.spmd": spmd}))
    b = summary["measurements"]["memory"]["breakdown"]
    assert (b["params_bytes"], b["gradients_bytes"], b["optimizer_bytes"]) == (
        params, gradients, optimizer + ADAM_COUNTERS)
    assert b["model_state_bytes"] == 0
