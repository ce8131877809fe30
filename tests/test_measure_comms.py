"""Collective counting in compiled HLO, against programs whose communication is known by hand."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
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
    """Payload: the 4096-byte buffer. Sent on a ring of 8: 2 x 7/8 x 4096 = 7168 bytes per device."""
    f = jax.shard_map(lambda x: jax.lax.psum(x, "d"), mesh=_mesh(), in_specs=P("d"), out_specs=P())
    report = count_collectives(_hlo(f, jnp.ones((8, 1024), jnp.float32)))
    assert report.by_kind == {"all-reduce": Collective(count=1, bytes=1024 * 4, sent_bytes=7168)}
    assert report.total_bytes == 4096 and report.total_sent_bytes == 7168


def test_all_gather_counts_the_gathered_bytes() -> None:
    """Payload: the gathered 8 x 1024 bytes. Sent on a ring of 8: 7/8 of it, 7168 bytes per device."""
    f = jax.shard_map(lambda x: jax.lax.all_gather(x, "d", tiled=True), mesh=_mesh(), in_specs=P("d"),
                      out_specs=P(), check_vma=False)
    report = count_collectives(_hlo(f, jnp.ones((8, 256), jnp.float32)))
    assert report.by_kind == {"all-gather": Collective(count=1, bytes=8 * 256 * 4, sent_bytes=7168)}


def test_psum_and_psum_scatter_with_all_gather_send_the_same_bytes() -> None:
    """The same 4096 bytes per device reduced two ways on 8 devices. psum: payload 4096, sent 2 x 7/8 x 4096 =
    7168. psum_scatter then all_gather: payload 4096 each (the scattered input, the gathered output), 8192 in
    all, sent 7/8 x 4096 = 3584 each, 7168 in all: the payloads differ by 2x, the bytes sent do not."""
    def scatter_gather(v: jax.Array) -> jax.Array:
        s = jax.lax.psum_scatter(v, "d", scatter_dimension=1, tiled=True)
        return jax.lax.all_gather(s, "d", axis=1, tiled=True)

    x = jnp.ones((8, 1024), jnp.float32)
    psum = jax.shard_map(lambda v: jax.lax.psum(v, "d"), mesh=_mesh(), in_specs=P("d"), out_specs=P("d"))
    zero = jax.shard_map(scatter_gather, mesh=_mesh(), in_specs=P("d"), out_specs=P("d"), check_vma=False)
    once, twice = count_collectives(_hlo(psum, x)), count_collectives(_hlo(zero, x))
    assert (once.total_bytes, twice.total_bytes) == (4096, 8192)
    assert twice.by_kind == {"reduce-scatter": Collective(count=1, bytes=4096, sent_bytes=3584),
                             "all-gather": Collective(count=1, bytes=4096, sent_bytes=3584)}
    assert once.total_sent_bytes == twice.total_sent_bytes == 7168


def test_sent_bytes_follow_each_op_s_group_size() -> None:
    """A psum over the 4-device axis of a (2, 4) mesh: groups of 4, so 2 x 3/4 x 4096 = 6144 bytes sent."""
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    f = jax.shard_map(lambda v: jax.lax.psum(v, "b"), mesh=mesh, in_specs=P(("a", "b")), out_specs=P("a"))
    report = count_collectives(_hlo(f, jnp.ones((8, 1024), jnp.float32)))
    assert report.by_kind == {"all-reduce": Collective(count=1, bytes=4096, sent_bytes=6144)}


@pytest.mark.parametrize(("spec", "out", "groups"), [
    (P("b", "a"), P("a"), ((0, 1), (2, 3), (4, 5), (6, 7))),  # over b: the pairs of a row of the (4, 2) mesh
    (P("a", "b"), P("b"), ((0, 2, 4, 6), (1, 3, 5, 7))),  # over a: the four of a column
])
def test_jits_groups_over_one_axis_of_a_2d_mesh_are_that_axis_s(spec: P, out: P,
                                                                groups: tuple[tuple[int, ...], ...]) -> None:
    """Under jit XLA writes groups in its mesh-axes form (replica_groups=mesh['axis_0'=2,'axis_1'=4],
    device_ids=([4,2]T(1,0)) {'axis_0'}); read as every device of the module, a sum over one axis of a 2-D mesh was
    charged as sent over all 8 (2 x 7/8 x its buffer), which overstated dp+tp's and dp+pp's bytes sent."""
    from jax.sharding import NamedSharding

    mesh = jax.make_mesh((4, 2), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    x = jax.device_put(jnp.ones((8, 1024), jnp.float32), NamedSharding(mesh, spec))
    hlo = jax.jit(lambda v: v.sum(0), out_shardings=NamedSharding(mesh, out)).lower(x).compile().as_text()
    report = count_collectives(hlo)
    [op] = report.ops
    size = len(groups[0])
    payload = 1024 * 4 // (8 // size)  # the sum's output, split over the other axis
    assert op.groups == groups
    assert report.by_kind == {"all-reduce": Collective(count=1, bytes=payload,
                                                       sent_bytes=round(2 * (size - 1) / size * payload))}


@pytest.mark.parametrize(("text", "groups"), [
    ("mesh['a'=8] {'a':(1)2}", ((0, 4), (1, 5), (2, 6), (3, 7))),  # a sub-axis: the middle of (pre, size, rest)
    ("mesh['a'=8] {'a':(2)2}", ((0, 2), (1, 3), (4, 6), (5, 7))),
    ("mesh['a'=8] {'a':(1)2,'a':(4)2}", ((0, 1, 4, 5), (2, 3, 6, 7))),
    ("mesh['x'=2,'y'=2], device_ids=(0,2,1,3) {'x'}", ((0, 1), (2, 3))),  # ids as a list
    ("mesh['x'=2,'y'=4] {'y','x'}", ((0, 4, 1, 5, 2, 6, 3, 7),)),  # two axes, in the order given
    ("mesh['x'=2] {}", ((0,), (1,))),  # no axis: each device alone
])
def test_the_mesh_axes_form_of_replica_groups_reads_as_xla_expands_it(text: str,
                                                                      groups: tuple[tuple[int, ...], ...]) -> None:
    """XLA's own expansion (MeshAxesReplicaGroupList): ids over the mesh, sub-axes as (pre, size, rest), the
    grouped parts last in the order given."""
    from shardbench.measure.comms import device_groups

    assert device_groups(f"replica_groups={text}, use_global_device_ids=true") == groups


def test_collectives_inside_a_scan_count_once_per_iteration() -> None:
    def body(x: jax.Array) -> jax.Array:
        def step(c: jax.Array, _: None) -> tuple[jax.Array, None]:
            return c + 0.1 * jax.lax.psum(c, "d"), None

        return jax.lax.scan(step, x, None, length=5)[0]

    f = jax.shard_map(body, mesh=_mesh(), in_specs=P("d"), out_specs=P("d"))
    report = count_collectives(_hlo(f, jnp.ones((8, 64), jnp.float32)))
    assert report.unknown_trip_counts == 0
    assert report.by_kind == {"all-reduce": Collective(count=5, bytes=5 * 64 * 4, sent_bytes=5 * 2 * 7 * 32)}


def test_no_collectives_on_one_device() -> None:
    report = count_collectives(_hlo(lambda x: (x @ x.T).sum(), jnp.ones((16, 16))))
    assert report.total_count == 0 and report.total_bytes == 0


def test_async_collectives_count_every_output_once() -> None:
    # GPU programs merge collectives and run them asynchronously; CPU programs do not, so this is hand-written HLO.
    # Groups left out ({} or none) are every device of the module: num_partitions=4 in its header.
    hlo = """HloModule m, entry_computation_layout={()->()}, num_partitions=4

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
    assert report.by_kind == {  # sent on a ring of 4: all-reduce 2 x 3/4, all-gather 3/4, a permute its buffer
        "all-reduce": Collective(count=1, bytes=2 * 1024 * 4, sent_bytes=12288),
        "all-gather": Collective(count=1, bytes=2 * 1024 * 4, sent_bytes=6144),
        "collective-permute": Collective(count=1, bytes=512 * 4, sent_bytes=512 * 4),
    }


def test_an_async_reduce_scatter_counts_its_input_as_the_sync_one_does() -> None:
    """GPU HLO's reduce-scatter-start returns ((operands), output): the payload is the 1024 float32 input (4096
    bytes), as for the synchronous form, not the 128-element scattered output; sent on a ring of 8: 7/8 of it."""
    head = "HloModule m, entry_computation_layout={()->()}, num_partitions=8\n\nENTRY %main () -> f32[128] {\n"
    groups = "replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, to_apply=%add"
    sync = (f"{head}  %a = f32[1024]{{0}} parameter(0)\n"
            f"  ROOT %rs = f32[128]{{0}} reduce-scatter(%a), {groups}\n}}\n")
    asyn = (f"{head}  %a = f32[1024]{{0}} parameter(0)\n"
            f"  %rss = ((f32[1024]{{0}}), f32[128]{{0}}) reduce-scatter-start(%a), {groups}\n"
            f"  ROOT %rsd = f32[128]{{0}} reduce-scatter-done(%rss)\n}}\n")
    expected = {"reduce-scatter": Collective(count=1, bytes=4096, sent_bytes=3584)}
    assert count_collectives(sync).by_kind == expected
    assert count_collectives(asyn).by_kind == expected


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
    # The scanned step moves what the unrolled one does (checked against XLA above), plus what the loop itself
    # adds each time round (its counter, and `w` broadcast inside the body: 1.19x the unrolled step's bytes on jax
    # 0.10.2's CPU compiler), never less; a body counted once too often lands near 1.5x, once too rarely near 0.9x.
    assert mine <= executed(looped.as_text())[1] <= 1.4 * mine
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
    assert report.by_kind["collective-permute"] == Collective(count=7, bytes=7 * 256, sent_bytes=7 * 256)
    assert along_one_axis(report.ops, (2, 2, 2), 1) == Collective(count=5, bytes=5 * 256, sent_bytes=5 * 256)
    assert along_one_axis(report.ops, (2, 2, 2), 0) == Collective(count=1, bytes=256, sent_bytes=256)
    assert along_one_axis(report.ops, (2, 2, 2), 2) == Collective(count=0, bytes=0, sent_bytes=0)


def test_a_collective_permute_is_sent_by_its_source_devices_alone() -> None:
    """Hand-written HLO on 8 devices. Inside a loop of 3: a shift split in two, as XLA splits a pipeline's
    backward ring, 2,048 bytes each; devices 1, 2, 3, 5, 6, 7 are sources in the first, 0 and 4 in the second, so
    each device sends one buffer per iteration: 6,144 bytes. After the loop, once: 14,336 bytes from devices 3 and 7
    alone, and 1,024 bytes that device 0 sends to two devices (2,048 from it). By device: 0 sends 8,192, 3 and 7
    20,480, every other 6,144. The record's figure is the fullest device's, 20,480, not the payload of 27,648 (every
    permute's buffer on every device, the figure before permutes were charged to their sources alone)."""
    hlo = """HloModule m, entry_computation_layout={()->()}, num_partitions=8

%body (p: (s32[], f32[512])) -> (s32[], f32[512]) {
  %p = (s32[], f32[512]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[512]{0} get-tuple-element(%p), index=1
  %most = f32[512]{0} collective-permute(%x), channel_id=1, source_target_pairs={{1,0},{2,1},{3,2},{5,4},{6,5},{7,6}}
  %wrap = f32[512]{0} collective-permute(%x), channel_id=2, source_target_pairs={{0,3},{4,7}}
  %y = f32[512]{0} add(%most, %wrap)
  ROOT %t = (s32[], f32[512]{0}) tuple(%i, %y)
}

%cond (c: (s32[], f32[512])) -> pred[] {
  %c = (s32[], f32[512]{0}) parameter(0)
  %n = s32[] get-tuple-element(%c), index=0
  %bound = s32[] constant(3)
  ROOT %lt = pred[] compare(%n, %bound), direction=LT
}

ENTRY %main () -> f32[256] {
  %init = (s32[], f32[512]{0}) parameter(0)
  %w = (s32[], f32[512]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %outs = f32[7,512]{1,0} parameter(1)
  %last = f32[7,512]{1,0} collective-permute(%outs), channel_id=3, source_target_pairs={{3,0},{7,4}}
  %g = f32[256]{0} parameter(2)
  ROOT %twice = f32[256]{0} collective-permute(%g), channel_id=4, source_target_pairs={{0,1},{0,2}}
}
"""
    from shardbench.measure.comms import fullest_sent

    report = count_collectives(hlo)
    assert report.by_kind == {"collective-permute": Collective(count=8, bytes=27648, sent_bytes=20480)}
    by_device: dict[int, int] = {}
    for op in report.ops:
        for device, sent in (op.sent_by_device() or {}).items():
            by_device[device] = by_device.get(device, 0) + op.count * sent
    assert by_device == {0: 8192, 1: 6144, 2: 6144, 3: 20480, 4: 6144, 5: 6144, 6: 6144, 7: 20480}
    assert fullest_sent(report.ops, 8) == (20480, sum(by_device.values()))
    assert report.total_sent_bytes == 20480


def test_ppermute_to_some_devices_is_charged_to_its_sources() -> None:
    """8 devices, a (4, 16) float32 block each (256 bytes). A scan of 3 runs two shifts per iteration, one from
    devices 0 and 4, the other from 1, 2, 5 and 6 (3 and 7 send in neither); then once, device 3 to 0. By hand:
    devices 0, 1, 2, 4, 5, 6 send 3 x 256 = 768 bytes, device 3 256, device 7 nothing; 7 permutes of 256 bytes in
    all (a payload of 1,792 per device)."""
    def body(x):
        def step(c, _):
            a = jax.lax.ppermute(c, "d", [(0, 1), (4, 5)])
            b = jax.lax.ppermute(c * 2, "d", [(1, 2), (2, 3), (5, 6), (6, 7)])
            return c + a + b, None

        x, _ = jax.lax.scan(step, x, None, length=3)
        return x + jax.lax.ppermute(x, "d", [(3, 0)])

    f = jax.shard_map(body, mesh=_mesh(), in_specs=P("d"), out_specs=P("d"))
    report = count_collectives(_hlo(f, jnp.ones((32, 16), jnp.float32)))
    assert report.by_kind == {"collective-permute": Collective(count=7, bytes=7 * 256, sent_bytes=3 * 256)}
    sources = sorted((op.count, sorted(op.sent_by_device() or {})) for op in report.ops)
    assert sources == [(1, [3]), (3, [0, 4]), (3, [1, 2, 5, 6])]


def test_all_to_all_sends_all_but_its_own_share_of_the_local_block() -> None:
    """`jax.lax.all_to_all` on 8 devices of a (64, 128) float32 array split by rows: each device holds an (8, 128)
    block, 8 x 128 x 4 = 4,096 bytes, cuts it into 8 column slices of 512 bytes and keeps one, sending the other 7:
    payload 4,096 bytes, sent 7/8 x 4,096 = 3,584 bytes per device (not the all-reduce's 2 x 7/8, 7,168)."""
    f = jax.shard_map(lambda x: jax.lax.all_to_all(x, "d", 1, 0, tiled=True), mesh=_mesh(), in_specs=P("d"),
                      out_specs=P("d"))
    report = count_collectives(_hlo(f, jnp.ones((64, 128), jnp.float32)))
    block = (64 // 8) * 128 * 4
    assert block == 4096
    assert report.by_kind == {"all-to-all": Collective(count=1, bytes=block, sent_bytes=block * 7 // 8)}
    assert report.total_sent_bytes == 3584


UNCOUNTED_LOOP = """HloModule m, entry_computation_layout={()->()}, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%body (p: (s32[], f32[1024])) -> (s32[], f32[1024]) {
  %p = (s32[], f32[1024]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[1024]{0} get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %sum = f32[1024]{0} all-reduce(%x), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  ROOT %t = (s32[], f32[1024]{0}) tuple(%next, %sum)
}

%cond (c: (s32[], f32[1024])) -> pred[] {
  %c = (s32[], f32[1024]{0}) parameter(0)
  %n = s32[] get-tuple-element(%c), index=0
  %bound = s32[] constant(5)
  ROOT %lt = pred[] compare(%n, %bound), direction=LT
}

ENTRY %main (x: f32[1024]) -> f32[1024] {
  %x = f32[1024]{0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[1024]{0}) tuple(%zero, %x)
  %w = (s32[], f32[1024]{0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[1024]{0} get-tuple-element(%w), index=1
}
"""


def test_a_loop_without_a_recorded_trip_count_runs_as_often_as_its_condition_bound() -> None:
    """Hand-written HLO as the TPU compiler leaves it: a `while` with no backend_config (no known_trip_count) whose
    condition is `compare(%n, constant(5)), direction=LT`, the counter starting at 0, so the body runs 5 times.
    The psum inside, of 1,024 float32 (4,096 bytes) over 8 devices, counts 5 times: payload 5 x 4,096 = 20,480
    bytes, sent 5 x 2 x 7/8 x 4,096 = 35,840; and no loop is reported as of unknown length."""
    hlo = UNCOUNTED_LOOP
    report = count_collectives(hlo)
    assert report.unknown_trip_counts == 0
    assert report.by_kind == {"all-reduce": Collective(count=5, bytes=5 * 4096, sent_bytes=5 * 2 * 7 * 4096 // 8)}


@pytest.mark.parametrize("condition", ["compare(%n, %bound), direction=LE", "compare(%bound, %n), direction=GT",
                                       "compare(%bound, %n), direction=LT"])
def test_a_loop_of_another_form_is_of_unknown_length_not_guessed(condition: str) -> None:
    """`n <= 5` runs 6 times from 0, `5 > n` is `n < 5` written the other way, and `5 < n` may not run at all:
    only JAX's own form, `counter < bound`, is read as `bound` iterations; any other is counted once and reported
    as a loop of unknown length."""
    report = count_collectives(UNCOUNTED_LOOP.replace("compare(%n, %bound), direction=LT", condition))
    assert report.unknown_trip_counts == 1
    assert report.by_kind["all-reduce"].count == 1


def test_a_loop_of_unknown_length_without_a_collective_leaves_the_counts_exact() -> None:
    """A ring attention's loops over key tiles have no recorded trip count and hold no collective: the counts are
    exact, and the report said every ring run undercounted ("32 loops of its step ran an unknown number of
    times"). The same loop holding the psum is reported; one calling it through another computation too."""
    quiet = UNCOUNTED_LOOP.replace(
        "%sum = f32[1024]{0} all-reduce(%x), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add",
        "%sum = f32[1024]{0} add(%x, %x)").replace("compare(%n, %bound), direction=LT",
                                                   "compare(%n, %bound), direction=LE")
    report = count_collectives(quiet)
    assert report.unknown_trip_counts == 0 and report.by_kind == {}
    loud = UNCOUNTED_LOOP.replace("compare(%n, %bound), direction=LT", "compare(%n, %bound), direction=LE")
    assert count_collectives(loud).unknown_trip_counts == 1
    # the psum one call further down: the loop's body calls a computation that holds it
    nested = loud.replace(
        "%sum = f32[1024]{0} all-reduce(%x), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add",
        "%sum = f32[1024]{0} call(%x), to_apply=%inner").replace(
        "%body (p:", "%inner (y: f32[1024]) -> f32[1024] {\n  %y = f32[1024]{0} parameter(0)\n  ROOT %r = "
                     "f32[1024]{0} all-reduce(%y), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, "
                     "to_apply=%add\n}\n\n%body (p:")
    assert count_collectives(nested).unknown_trip_counts == 1
    assert count_collectives(nested).by_kind["all-reduce"].count == 1
