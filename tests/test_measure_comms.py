"""Collective counting in compiled HLO, against programs whose communication is known by hand."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from shardbench.measure.comms import count_collectives, shape_bytes
from shardbench.measure.run_record import Collective


def _mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))


def _hlo(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


def test_shape_bytes() -> None:
    assert shape_bytes("f32[8,128]{1,0}") == [4096]
    assert shape_bytes("(bf16[4], s32[2,2], pred[])") == [8, 16, 1]


def test_one_psum_is_one_all_reduce_of_the_local_block() -> None:
    f = jax.shard_map(lambda x: jax.lax.psum(x, "d"), mesh=_mesh(), in_specs=P("d"), out_specs=P())
    report = count_collectives(_hlo(f, jnp.ones((8, 1024), jnp.float32)))
    assert report.by_kind == {"all-reduce": Collective(count=1, bytes=1024 * 4)}


def test_all_gather_counts_the_gathered_bytes() -> None:
    f = jax.shard_map(lambda x: jax.lax.all_gather(x, "d", tiled=True), mesh=_mesh(), in_specs=P("d"),
                      out_specs=P(), check_vma=False)
    report = count_collectives(_hlo(f, jnp.ones((8, 256), jnp.float32)))
    assert report.by_kind == {"all-gather": Collective(count=1, bytes=8 * 256 * 4)}


def test_collectives_inside_a_scan_count_once_per_iteration() -> None:
    def body(x: jax.Array) -> jax.Array:
        def step(c: jax.Array, _: None) -> tuple[jax.Array, None]:
            return c + 0.1 * jax.lax.psum(c, "d"), None

        return jax.lax.scan(step, x, None, length=5)[0]

    f = jax.shard_map(body, mesh=_mesh(), in_specs=P("d"), out_specs=P("d"))
    report = count_collectives(_hlo(f, jnp.ones((8, 64), jnp.float32)))
    assert report.unknown_trip_counts == 0
    assert report.by_kind == {"all-reduce": Collective(count=5, bytes=5 * 64 * 4)}


def test_no_collectives_on_one_device() -> None:
    report = count_collectives(_hlo(lambda x: (x @ x.T).sum(), jnp.ones((16, 16))))
    assert report.total_count == 0 and report.total_bytes == 0


def test_async_collectives_count_every_output_once() -> None:
    # GPU programs merge collectives and run them asynchronously; CPU programs do not, so this is hand-written HLO.
    hlo = """HloModule m, entry_computation_layout={()->()}

ENTRY %main () -> f32[] {
  %a = f32[1024]{0} parameter(0)
  %b = f32[1024]{0} parameter(1)
  %ars = (f32[1024]{0}, f32[1024]{0}) all-reduce-start(%a, %b), replica_groups={}, to_apply=%add
  %ard = (f32[1024]{0}, f32[1024]{0}) all-reduce-done(%ars)
  %ags = ((f32[256]{0}, f32[256]{0}), (f32[1024]{0}, f32[1024]{0})) all-gather-start(%a, %b), dimensions={0}
  %agd = (f32[1024]{0}, f32[1024]{0}) all-gather-done(%ags)
  %cps = (f32[512]{0}, f32[512]{0}, u32[], u32[]) collective-permute-start(%a), source_target_pairs={{0,1}}
  ROOT %cpd = f32[512]{0} collective-permute-done(%cps)
}
"""
    report = count_collectives(hlo)
    assert report.by_kind == {
        "all-reduce": Collective(count=1, bytes=2 * 1024 * 4),
        "all-gather": Collective(count=1, bytes=2 * 1024 * 4),
        "collective-permute": Collective(count=1, bytes=512 * 4),
    }


def test_bytes_moved_match_xla_where_nothing_loops_and_count_every_iteration_where_it_does() -> None:
    """The traffic the planner counts agrees with XLA's cost analysis (within 2%) on a step with no loop; with
    the same work under a 4-step scan, XLA counts the body once while the count here grows with the steps."""
    from shardbench.measure.comms import executed
    from shardbench.measure.flops import xla_cost

    w = jnp.ones((256, 256))

    def unrolled(x: jax.Array) -> jax.Array:
        for _ in range(4):
            x = jnp.tanh(x @ w)
        return x

    def scanned(x: jax.Array) -> jax.Array:
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=4)[0]

    x = jnp.ones((512, 256))
    flat = jax.jit(unrolled).lower(x).compile()
    mine, xla = executed(flat.as_text())[1], xla_cost(flat, "bytes accessed")
    assert xla is not None and abs(mine - xla) / xla < 0.02
    looped = jax.jit(scanned).lower(x).compile()
    once = executed(jax.jit(lambda v: jnp.tanh(v @ w)).lower(x).compile().as_text())[1]
    assert executed(looped.as_text())[1] >= 4 * once * 0.9
    assert xla_cost(looped, "bytes accessed") < 2 * once


def test_permutes_along_the_stage_axis_alone_are_the_stage_to_stage_transfers() -> None:
    """On a (data 2, stage 2, model 2) mesh: a ring shift over stage inside a 5-iteration scan, then one shift over
    data and one diagonal shift over data and stage at once. Each device holds a (4, 16) float32 block (256 bytes):
    5 transfers of 256 bytes along stage alone; neither other shift is one of them."""
    from shardbench.measure.comms import along_one_axis

    mesh = jax.make_mesh((2, 2, 2), ("data", "stage", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 3)

    def body(x):
        def shift(c, _):
            return jax.lax.ppermute(c, "stage", [(0, 1), (1, 0)]), None

        x, _ = jax.lax.scan(shift, x, None, length=5)
        x = jax.lax.ppermute(x, "data", [(0, 1), (1, 0)])
        return jax.lax.ppermute(x, ("data", "stage"), [(0, 3), (3, 0), (1, 2), (2, 1)])

    f = jax.shard_map(body, mesh=mesh, in_specs=P(("data", "stage", "model")), out_specs=P(("data", "stage", "model")))
    report = count_collectives(_hlo(f, jnp.ones((32, 16), jnp.float32)))
    assert report.by_kind["collective-permute"] == Collective(count=7, bytes=7 * 256)
    assert along_one_axis(report.ops, (2, 2, 2), 1) == Collective(count=5, bytes=5 * 256)
    assert along_one_axis(report.ops, (2, 2, 2), 0) == Collective(count=1, bytes=256)
    assert along_one_axis(report.ops, (2, 2, 2), 2) == Collective(count=0, bytes=0)
