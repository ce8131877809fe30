"""Which link a collective crosses: the devices of each of its groups on one node (NVLink, a TPU host's ICI),
or spread over nodes (InfiniBand, the data-center network). Placement: the program's device i (its position in
the mesh, data axis outermost) sits on node i // devices_per_node, the way a mesh is laid over the nodes of a
cluster (`shardbench.devices.select_devices` orders devices by process, then id).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardbench.measure.comms import CommsReport

INTRA, INTER = "intra-node", "inter-node"


def link_of(groups: tuple[tuple[int, ...], ...] | None, devices: int, per_node: int) -> str:
    """INTRA when every group's devices share a node, else INTER; no groups means all `devices` in one."""
    spans = groups if groups is not None else (tuple(range(devices)),)
    return INTRA if all(len({d // per_node for d in g}) <= 1 for g in spans) else INTER


@dataclass(frozen=True)
class LinkBytes:
    """Bytes per device per step each link carries, by collective kind."""

    intra: dict[str, int]
    inter: dict[str, int]


def bytes_by_link(report: CommsReport, devices: int, per_node: int) -> LinkBytes:
    """Every collective's bytes per device per step, assigned to the link it crosses."""
    intra: dict[str, int] = {}
    inter: dict[str, int] = {}
    for op in report.ops:
        side = intra if link_of(op.groups, devices, per_node) == INTRA else inter
        side[op.kind] = side.get(op.kind, 0) + op.count * op.bytes_each
    return LinkBytes(intra, inter)
