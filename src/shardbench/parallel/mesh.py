"""Parse a `--mesh` spec into named axis sizes, and build the device mesh from them.

A mesh is data: every axis shardbench knows is named in `MESH_AXES`, outermost first, and a `MeshShape` gives
each a size (1 where a run does not use it). The built mesh always carries every known axis, so a
PartitionSpec naming any of them is valid on any run's mesh; adding a kind of parallelism is adding its axis
name here and a strategy that uses it (shardbench.parallel.strategies).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardbench.devices import MAX_SIMULATED
from shardbench.errors import ConfigError

if TYPE_CHECKING:  # JAX only where a mesh is built: parsing a --mesh spec (the command line's checks) needs none
    import jax
    from jax.sharding import Mesh

DATA, STAGE, MODEL, EXPERT = "data", "stage", "model", "expert"
SEQUENCE = "seq"  # context parallelism: the sequence split over devices (shardbench.parallel.context)
# Outermost first: the data axis spans hosts first, so a process holds neighbouring rows of the batch; pipeline
# stages come next (each moves one microbatch's activations a step, less than a tensor-parallel layer does), and
# the model axis is innermost, where the links are fastest. The expert axis (a mixture's experts, and with data the
# batch outside them) and the seq axis (context parallelism) come last: appended, so that adding them moved no
# other axis.
MESH_AXES: tuple[str, ...] = (DATA, STAGE, MODEL, EXPERT, SEQUENCE)
# More devices than any machine holds (the largest clusters hold some hundreds of thousands): a mesh beyond it is a
# mistyped size, said as one, rather than compared with the devices in use.
MAX_MESH = 2**24


@dataclass(frozen=True)
class MeshShape:
    """The size of every axis in `MESH_AXES`, in that order."""

    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.sizes) != len(MESH_AXES):
            raise ValueError(f"MeshShape needs one size per axis {MESH_AXES}, got {self.sizes}")

    @classmethod
    def of(cls, **sizes: int) -> MeshShape:
        """MeshShape.of(data=4, model=2); axes left out have size 1."""
        unknown = set(sizes) - set(MESH_AXES)
        if unknown:
            raise ValueError(f"unknown mesh axes {sorted(unknown)}: the axes are {', '.join(MESH_AXES)}")
        return cls(tuple(sizes.get(axis, 1) for axis in MESH_AXES))

    def __getitem__(self, axis: str) -> int:
        return self.sizes[MESH_AXES.index(axis)]

    def items(self) -> Iterator[tuple[str, int]]:
        return iter(zip(MESH_AXES, self.sizes))

    def as_dict(self) -> dict[str, int]:
        return dict(self.items())

    @property
    def data(self) -> int:
        return self[DATA]

    @property
    def model(self) -> int:
        return self[MODEL]

    @property
    def stage(self) -> int:
        return self[STAGE]

    @property
    def expert(self) -> int:
        return self[EXPERT]

    @property
    def seq(self) -> int:
        return self[SEQUENCE]

    @property
    def size(self) -> int:
        """The device count: Python's exact product (numpy's int64 wraps past 2**63, to 0 or below)."""
        return math.prod(self.sizes)

    def __str__(self) -> str:
        """'4x2' (data x model) while only those two axes are split; 'data=2,stage=4' once another is."""
        if all(size == 1 for axis, size in self.items() if axis not in (DATA, MODEL)):
            return f"{self.data}x{self.model}"
        return ",".join(f"{axis}={size}" for axis, size in self.items() if size > 1)


def mesh_size(spec: str) -> int | None:
    """The device count a mesh names ('4x2' -> 8, 'model=8' -> 8), or None where it takes every device ('')
    or none ('none')."""
    text = spec.strip().lower()
    if text in ("", "auto", "none"):
        return None
    size = parse_mesh(spec, None).size
    if size > MAX_SIMULATED:  # `inspect` simulates the devices a mesh names: XLA starts at most this many
        raise ConfigError(f"--mesh {spec} names {size:,} devices, more than the {MAX_SIMULATED} CPU devices "
                          f"shardbench simulates: use a mesh of at most {MAX_SIMULATED}")
    return size


def parse_mesh(spec: str, num_devices: int | None, primary: str = DATA) -> MeshShape:
    """'' -> every device on `primary`; 'N' -> N on `primary`; 'AxB' -> data=A, model=B; 'name=N,...' names
    any of `MESH_AXES`. `num_devices` None: do not check the count (only for a mesh that names its sizes). Sizes
    are ASCII digits: Python's int() would read '４' or '٤' as 4, which no other tool would."""
    text = spec.strip().lower()
    hint = f"use N, AxB (data x model) or name=N,... over the axes {', '.join(MESH_AXES)}"
    sizes: dict[str, int]
    if text in ("", "auto"):
        sizes = {primary: num_devices or 1}
    elif re.fullmatch(r"\d+", text, re.ASCII):
        sizes = {primary: int(text)}
    elif re.fullmatch(r"\d+x\d+", text, re.ASCII):
        a, b = text.split("x")
        sizes = {DATA: int(a), MODEL: int(b)}
    elif re.fullmatch(r"(\w+=\d+)(,\w+=\d+)*", text, re.ASCII):
        sizes = {}
        for part in text.split(","):
            name, value = part.split("=")
            if name not in MESH_AXES:
                raise ConfigError(f"--mesh '{spec}': unknown axis '{name}': the axes are {', '.join(MESH_AXES)}")
            if name in sizes:
                raise ConfigError(f"--mesh '{spec}': axis '{name}' is named twice: name each axis once")
            sizes[name] = int(value)
    elif re.search(r"(^|[=x,])-\d", text, re.ASCII):  # read as not a mesh, where a zero was named as such
        raise ConfigError(f"--mesh '{spec}': a size is negative; every axis needs at least one device")
    elif "," in text and any("=" not in part for part in text.split(",")) and "=" in text:
        # 'data=2,model=4,8': a sweep's list of meshes, whose alternatives hold commas, is separated by ';'
        raise ConfigError(f"--mesh '{spec}' is not a mesh: {hint}; a list of meshes (a sweep's) is separated by "
                          f"';' where its meshes hold commas ('data=2,model=4;8')")
    else:
        raise ConfigError(f"--mesh '{spec}' is not a mesh: {hint}")
    shape = MeshShape.of(**sizes)
    if min(shape.sizes) < 1:
        raise ConfigError(f"--mesh '{spec}': every axis needs at least one device")
    if shape.size > MAX_MESH:
        raise ConfigError(f"--mesh {shape} names {shape.size:,} devices, more than any machine holds (at most "
                          f"{MAX_MESH:,} here): check the axis sizes")
    if num_devices is not None and shape.size != num_devices:
        are = "device is" if num_devices == 1 else "devices are"
        # --devices simulates CPU devices up to MAX_SIMULATED; past it only a mesh over the devices there is right.
        more = f", or pass --devices {shape.size}" if shape.size <= MAX_SIMULATED else ""
        raise ConfigError(  # the mesh as the user wrote it ('model=4', not its '1x4')
            f"--mesh {spec.strip()} has {shape.size} devices but {num_devices} {are} in use: make the mesh's "
            f"product equal the device count{more}"
        )
    return shape


def same_mesh(spec: str) -> str:
    """One spelling for every spelling of a mesh ('4x2', 'data=4,model=2', 'MODEL=2,DATA=4' -> '4x2'; 'auto' ->
    '', every device; '08' -> '8'), so that a sweep runs it once. A bare N keeps its own spelling, as its axis is
    the strategy's ('8' is not '8x1' under pp), as does what is not a mesh (refused later, in its own words)."""
    text = spec.strip().lower()
    if text in ("", "auto", "none"):
        return "" if text == "auto" else text
    if re.fullmatch(r"\d+", text, re.ASCII):
        return str(int(text))
    try:
        return str(parse_mesh(text, None))
    except ConfigError:
        return text


def build_mesh(shape: MeshShape, devices: list[jax.Device]) -> Mesh:
    """A mesh with automatic (GSPMD) axes over every axis of `MESH_AXES`, in that order."""
    import numpy as np
    from jax.sharding import AxisType, Mesh

    grid = np.asarray(devices).reshape(shape.sizes)
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))

