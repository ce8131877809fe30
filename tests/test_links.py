"""Collectives' device groups read from HLO, and the link each one crosses on a placement over nodes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from shardbench.measure.comms import count_collectives, device_groups
from shardbench.measure.links import INTER, INTRA, bytes_by_link, link_of


def test_iota_and_explicit_groups_on_a_2x8_placement() -> None:
    """16 devices, 8 per node: a collective over the inner 8 stays on a node, one over pairs (i, i + 8) crosses."""
    inner = device_groups("channel_id=1, replica_groups=[2,8]<=[16], use_global_device_ids=true")
    assert inner == (tuple(range(8)), tuple(range(8, 16)))
    across = device_groups("replica_groups=[8,2]<=[2,8]T(1,0), use_global_device_ids=true")
    assert across == tuple((i, i + 8) for i in range(8))
    assert link_of(inner, 16, 8) == INTRA and link_of(across, 16, 8) == INTER
    explicit = device_groups("replica_groups={{0,1,2,3},{4,5,6,7},{8,9,10,11},{12,13,14,15}}, to_apply=%add")
    assert explicit == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15))
    assert link_of(explicit, 16, 8) == INTRA and link_of(explicit, 16, 2) == INTER
    pairs = device_groups("source_target_pairs={{7,8},{15,0}}")
    assert pairs == ((7, 8), (15, 0)) and link_of(pairs, 16, 8) == INTER
    assert link_of(None, 16, 8) == INTER and link_of(None, 8, 8) == INTRA  # no groups: every device in one


def test_a_compiled_programs_collectives_go_to_their_links() -> None:
    """A 2x4 mesh placed 4 devices per node: the psum over 'data' crosses nodes, the one over 'model' does not;
    each moves the 64 bytes of its f32[4,4] block per device."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))

    def both(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jax.lax.psum(x, "data"), jax.lax.psum(x, "model")

    step = jax.jit(jax.shard_map(both, mesh=mesh, in_specs=P("data", "model"),
                                 out_specs=(P(None, "model"), P("data", None))))
    report = count_collectives(step.lower(jnp.ones((8, 16))).compile().as_text())
    groups = sorted(op.groups for op in report.ops)
    assert groups == [((0, 1, 2, 3), (4, 5, 6, 7)), ((0, 4), (1, 5), (2, 6), (3, 7))]
    links = bytes_by_link(report, devices=8, per_node=4)
    assert links.intra == {"all-reduce": 64} and links.inter == {"all-reduce": 64}
    assert bytes_by_link(report, devices=8, per_node=8).inter == {}  # one node holds the whole mesh
