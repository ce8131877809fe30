"""`--target`: the hardware a plan is for, by count and chip.

    8xh100        one node of 8 H100s (NVLink inside the node)
    2x8xh100      2 nodes x 8 H100s (NVLink inside a node, InfiniBand across); a node holds at most the chip's
                  per-node count (8 H100s), so 16 H100s are 2x8xh100, never 16xh100; a chip whose data sheet
                  gives no bandwidth between nodes (v100, l4) is planned on one node only
    tpu-v5e:16x16 a TPU v5e slice of 16x16 chips (ICI inside the slice; 8 chips per host)
    tpu-v4:4x4x4  a TPU v4 slice of 4x4x4 chips
    tpu-v3:4x4    a TPU v3 slice of 4x4 chips: 32 JAX devices (each v2 or v3 chip is two, one per TensorCore)

    A slice has the sides of its chip's pods (`Chip.slice_dims`): v2, v3, v5e and v6e slices are 2-D (AxB), v4
    and v5p slices 3-D (AxBxC, the smallest 2x2x1); another count is refused in one line with the right spelling.
    cpu           this host (its measured matmul peak and memory)

A target counts JAX devices, as the compiled mesh and the TPU compiler's topology do; `Target.chips` counts the
chips, which prices are per.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass

from shardbench.errors import ConfigError
from shardbench.hardware import BY_NAME, Chip

HINT = "e.g. 8xh100, 2x8xh100, tpu-v5e:16x16, tpu-v4:4x4x4 or cpu"


@dataclass(frozen=True)
class Target:
    """`devices` JAX devices of one chip (`chip` None: this host's CPU), `per_node` of them to a node or host; a TPU
    slice keeps its topology in chips (its chips share ICI whatever the host)."""

    spec: str
    chip: Chip | None
    devices: int
    per_node: int
    topology: tuple[int, ...] = ()

    @property
    def nodes(self) -> int:
        """Nodes (hosts) the devices span."""
        return math.ceil(self.devices / self.per_node)

    @property
    def chips(self) -> int:
        """Chips the devices are (a CPU target's simulated devices count as themselves)."""
        return self.devices if self.chip is None else self.chip.chips(self.devices)

    def counted(self) -> str:
        """The devices in words, with their chips where a chip is more than one device: "32 devices (16 tpu-v3
        chips)"."""
        if self.chip is None or self.chip.devices_per_chip == 1:
            return f"{self.devices} device(s)"
        return f"{self.devices} devices ({self.chips} {self.chip.name} chips)"

    def priced_on(self, per: str) -> str:
        """What a price row counts on this target: its hosts (a row priced per host, the CPU's) or its devices
        (and chips, where a chip is two devices)."""
        return f"{self.nodes} host(s)" if per == "host" else self.counted()


def _chip(name: str, spec: str) -> Chip:
    if name not in BY_NAME:
        raise ConfigError(f"--target {spec}: unknown chip '{name}'; choose one of {', '.join(BY_NAME)} ({HINT})")
    return BY_NAME[name]


def parse_target(spec: str, cpu_devices: int = 1) -> Target:
    """The target `spec` names, or one line saying what is wrong and what would be right."""
    text = spec.strip().lower()
    if text == "cpu":
        return Target(text, None, cpu_devices, cpu_devices)
    if ":" in text:
        name, _, shape = text.partition(":")
        if name == "cpu":  # not a slice: this host, with as many simulated devices as --devices gives
            raise ConfigError(f"--target {spec}: the CPU target is 'cpu', its devices counted by --devices "
                              f"(--target cpu --devices {shape if shape.isdigit() else 8})")
        if not re.fullmatch(r"\d+(x\d+){1,2}", shape):
            raise ConfigError(f"--target {spec}: a TPU slice is CHIP:AxB or CHIP:AxBxC ({HINT})")
        chip = _chip(name, spec)
        if not name.startswith("tpu-"):
            raise ConfigError(f"--target {spec}: a topology (:{shape}) is for TPU chips; write {name} targets as "
                              f"NODESxPER_NODEx{name}")
        dims = tuple(int(v) for v in shape.split("x"))
        if min(dims) < 1:
            raise ConfigError(f"--target {spec}: every side of the slice needs at least one chip")
        _check_sides(spec, chip, dims)
        _check_hosts(spec, chip, dims)
        chips = math.prod(dims)
        if chip.pod_chips and chips > chip.pod_chips:  # libtpu describes any shape, a 32x32 v6e too
            raise ConfigError(f"--target {spec}: {chips:,} chips, and a whole {chip.name} pod holds "
                              f"{chip.pod_chips:,}: give a slice of at most that many")
        return Target(text, chip, chips * chip.devices_per_chip, chip.devices_per_node, dims)
    found = re.fullmatch(r"(?:(\d+)x)?(\d+)x([a-z0-9\-]+)", text)
    if not found:
        raise ConfigError(f"--target '{spec}' is not a target ({HINT})")
    nodes, per_node, name = int(found.group(1) or 1), int(found.group(2)), found.group(3)
    chip = _chip(name, spec)
    if nodes < 1 or per_node < 1:
        raise ConfigError(f"--target {spec}: nodes and chips per node must be at least 1")
    if name.startswith("tpu-"):
        raise ConfigError(f"--target {spec}: give a TPU slice by its topology, e.g. "
                          f"{name}:{slice_shape(nodes * per_node, chip.slice_dims or 2)}")
    if per_node > chip.devices_per_node:
        raise ConfigError(f"--target {spec}: one {name} node holds {chip.devices_per_node}; write "
                          f"{_in_nodes(nodes * per_node, chip.devices_per_node)}x{name}")
    target = Target(text, chip, nodes * per_node, per_node)  # as written, without spaces or capitals
    if unlinked(target):
        raise ConfigError(f"--target {spec}: the {name}'s data sheet gives no bandwidth between nodes; plan one node "
                          f"({per_node}x{name})")
    return target


def slice_shape(chips: int, sides: int) -> str:
    """`chips` as a slice of `sides` sides, as near square as powers of two allow: 8 chips in 2 sides 2x4, in 3
    2x2x2; a count that is no power of two, a 1-wide slice (3 in 2 sides: 1x3)."""
    dims = [1] * sides
    left = chips
    while left % 2 == 0:
        dims[dims.index(min(dims))] *= 2
        left //= 2
    dims[dims.index(min(dims))] *= left
    return "x".join(str(d) for d in sorted(dims))


def _check_sides(spec: str, chip: Chip, dims: tuple[int, ...]) -> None:
    """One line where a slice has another number of sides than the chip's pods (`Chip.slice_dims`): a v5e, v6e, v3
    or v2 slice is 2-D, a v4 or v5p slice 3-D. libtpu describes any shape it is given (a 2x2x2 v5e too, which no
    pod holds), so this is checked here, before compiling for hardware that does not exist."""
    sides = chip.slice_dims
    if sides is None or len(dims) == sides:
        return
    if sides == 3:  # AxB: the same chips are AxBx1, as Google spells the smallest slice (2x2x1)
        right = (*dims, 1)
    elif dims[-1] == 1:  # AxBx1: the same chips, as AxB
        right = dims[:-1]
    else:  # the same number of chips on the squarest AxB
        chips = math.prod(dims)
        a = max(d for d in range(1, math.isqrt(chips) + 1) if chips % d == 0)
        right = (a, chips // a)
    short = chip.name.removeprefix("tpu-")
    form = "AxBxC" if sides == 3 else "AxB"
    raise ConfigError(f"--target {spec}: a {short} slice is {sides}-D ({form}, e.g. {chip.name}:"
                      f"{'x'.join(map(str, right))})")


# The chips of one TPU host along a slice's first two sides, as the TPU compiler describes a slice without its
# hardware (`plan.tpu.topology_devices`): a slice within one host is that host's, a larger one is made of whole
# hosts.
HOST_SIDES = (2, 2)


def within_one_host(dims: tuple[int, ...] | list[int]) -> bool:
    """Whether a slice of sides `dims` fits in one host (`HOST_SIDES`): a v5e's 1x1 or 2x2, a v4's 2x2x1."""
    return all(d <= h for d, h in zip(dims, HOST_SIDES)) and all(d == 1 for d in dims[2:])


def _check_hosts(spec: str, chip: Chip, dims: tuple[int, ...]) -> None:
    """One line, before compiling, where a slice larger than one host does not split into whole hosts of 2x2
    chips along its first two sides (libtpu refuses it at compile time: "not divisible by chips_per_host_bounds")."""
    if within_one_host(dims) or all(d % h == 0 for d, h in zip(dims, HOST_SIDES)):
        return
    even = [max(h, d + d % h) for d, h in zip(dims, HOST_SIDES)] + list(dims[2:])
    raise ConfigError(f"--target {spec}: a slice larger than one host is made of whole hosts of "
                      f"{'x'.join(map(str, HOST_SIDES))} chips, so its first two sides are even; e.g. "
                      f"{chip.name}:{'x'.join(map(str, even))}")


def unlinked(target: Target) -> bool:
    """A GPU target across nodes whose chip's data sheet gives no bandwidth between nodes (the v100's, the l4's):
    its traffic across nodes could not be timed (a TPU slice is ICI throughout, whatever its hosts)."""
    chip = target.chip
    return chip is not None and not target.topology and target.nodes > 1 and chip.inter_bandwidth is None


def _in_nodes(devices: int, most: int) -> str:
    """`devices` as NODESxPER_NODE on the fewest nodes of at most `most` that hold them evenly: 16 of 8 -> 2x8."""
    nodes = next(n for n in range(-(-devices // most), devices + 1) if devices % n == 0)
    return f"{nodes}x{devices // nodes}"


def ignored_layout_notes(given: Collection[str], target: Target, command: str) -> list[str]:
    """A line for each layout flag the command line gave that `command` (plan, tune) does not read: it lays out
    every candidate strategy on every mesh the target's devices allow, and an accelerator target gives its own
    device count (a CPU target takes --devices)."""
    notes = [f"{flag} does nothing here: {command} lays out every candidate strategy on every mesh the target's "
             f"devices allow (--candidates names the strategies)"
             for key, flag in (("parallel.strategy", "--strategy"), ("parallel.mesh", "--mesh")) if key in given]
    if "parallel.devices" in given and target.chip is not None:
        notes.append(f"--devices does nothing with --target {target.spec}: it has {target.devices} device(s)")
    return notes
