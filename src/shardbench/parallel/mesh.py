"""Parse a `--mesh` spec and build a 2-D ('data', 'model') device mesh from it."""

from __future__ import annotations

import re
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from shardbench.errors import ConfigError

DATA, MODEL = "data", "model"
MESH_AXES = (DATA, MODEL)


@dataclass(frozen=True)
class MeshShape:
    """Sizes of the data and model axes."""

    data: int
    model: int

    @property
    def size(self) -> int:
        return self.data * self.model

    def __str__(self) -> str:
        return f"{self.data}x{self.model}"


def mesh_size(spec: str) -> int | None:
    """The device count a mesh names ('4x2' -> 8, 'model=8' -> 8), or None where it takes every device ('')
    or none ('none')."""
    text = spec.strip().lower()
    if text in ("", "auto", "none"):
        return None
    return parse_mesh(spec, None).size


def parse_mesh(spec: str, num_devices: int | None, primary: str = DATA) -> MeshShape:
    """'' -> every device on `primary`; 'N' -> N on `primary`; 'AxB' -> data=A, model=B; 'data=A,model=B'.
    `num_devices` None: do not check the count (only for a mesh that names its sizes)."""
    text = spec.strip().lower()
    hint = "use N, AxB (data x model) or data=A,model=B"
    if text in ("", "auto"):
        sizes = {DATA: 1, MODEL: 1, primary: num_devices or 1}
    elif re.fullmatch(r"\d+", text):
        sizes = {DATA: 1, MODEL: 1, primary: int(text)}
    elif re.fullmatch(r"\d+x\d+", text):
        a, b = text.split("x")
        sizes = {DATA: int(a), MODEL: int(b)}
    elif re.fullmatch(r"(\w+=\d+)(,\w+=\d+)*", text):
        sizes = {DATA: 1, MODEL: 1}
        for part in text.split(","):
            name, value = part.split("=")
            if name not in sizes:
                raise ConfigError(f"--mesh '{spec}': unknown axis '{name}': the axes are data and model")
            sizes[name] = int(value)
    else:
        raise ConfigError(f"--mesh '{spec}' is not a mesh: {hint}")
    shape = MeshShape(sizes[DATA], sizes[MODEL])
    if min(shape.data, shape.model) < 1:
        raise ConfigError(f"--mesh '{spec}': every axis needs at least one device")
    if num_devices is not None and shape.size != num_devices:
        are = "device is" if num_devices == 1 else "devices are"
        raise ConfigError(
            f"--mesh {shape} has {shape.size} devices but {num_devices} {are} in use: make the mesh's product "
            f"equal the device count, or pass --devices {shape.size}"
        )
    return shape


def build_mesh(shape: MeshShape, devices: list[jax.Device]) -> Mesh:
    """A mesh with automatic (GSPMD) axes; 'data' is the outer axis, so it spans hosts first."""
    grid = np.asarray(devices).reshape(shape.data, shape.model)
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto, AxisType.Auto))
