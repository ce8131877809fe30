"""Compiling for a TPU slice on a machine without one: the TPU compiler (libtpu) through
`jax.experimental.topologies`, as MaxText's ahead-of-time compilation does (`train_compile.py`). An optional
extra: `pip install 'shardbench[tpu]'`, which installs the libtpu that the installed jax pins.

Without TPU hardware libtpu still compiles: `get_topology_desc` describes the slice's devices, and a program
lowered for a mesh over them compiles to the TPU's own memory figures and collectives.
"""

from __future__ import annotations

import importlib.util
import math
import os

import jax

from shardbench.errors import ConfigError
from shardbench.plan.target import HOST_SIDES, within_one_host

INSTALL = "pip install 'shardbench[tpu]' (or pip install 'jax[tpu]')"
# libtpu's names for the chips, and how a chip's cores appear: v4 and v5p join a chip's two cores into one
# device ("megacore"), as their slices are used.
TOPOLOGY_NAMES = {"tpu-v4": ("v4", "megacore"), "tpu-v5p": ("v5", "megacore"), "tpu-v5e": ("v5e", "default"),
                  "tpu-v6e": ("v6e", "default"), "tpu-v3": ("v3", "default"), "tpu-v2": ("v2", "default")}
ACCELERATOR_TYPES = {"tpu-v4": "v4-{cores}", "tpu-v5p": "v5p-{cores}", "tpu-v5e": "v5litepod-{chips}",
                     "tpu-v6e": "v6e-{chips}", "tpu-v3": "v3-{cores}", "tpu-v2": "v2-{cores}"}
# Set for a process that describes a slice it is not running on: without them libtpu warns that it cannot
# find its host; ALLOW_MULTIPLE_LIBTPU_LOAD lets parallel workers load it at once.
ENVIRON = {"TPU_WORKER_HOSTNAMES": "localhost", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def libtpu_installed() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def check_available(spec: str) -> None:
    """One line, before any compilation, when a TPU target cannot be compiled for here."""
    if not libtpu_installed():
        raise ConfigError(f"--target {spec}: compiling for a TPU needs libtpu, which is not installed: {INSTALL}")


def topology_devices(chip: str, shape: list[int]) -> list[jax.Device]:
    """The devices of a TPU slice of `chip` (e.g. "tpu-v5e") with `shape` chips, without the hardware, ordered
    by host, then by their coordinates, as `shardbench.devices.select_devices` orders a slice's devices (the
    mesh is laid over them in that order, its data axis spanning hosts first)."""
    from jax.experimental import topologies

    name, config = TOPOLOGY_NAMES[chip]
    chips = math.prod(shape)
    # The slice's own name for it: without one libtpu warns that it cannot tell (it changes no figure).
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", ACCELERATOR_TYPES[chip].format(chips=chips, cores=2 * chips))
    for key, value in ENVIRON.items():
        os.environ.setdefault(key, value)
    dims = list(shape) + [1] * (3 - len(shape)) if name in ("v4", "v5") else list(shape)
    wrap = tuple(d >= 16 for d in dims[:2]) + (False,)  # a full pod's sides wrap around (a torus)
    # A slice within one host (a v5e's 1x1) is that host's chips; a larger one is made of hosts of 2x2 chips.
    host = (*dims[:2], 1) if within_one_host(dims) else (*HOST_SIDES, 1)
    topo = topologies.get_topology_desc(platform="tpu", topology_name=f"{name}:{'x'.join(map(str, dims))}",
                                        chip_config_name=config, chips_per_host_bounds=host, num_slices=1,
                                        wrap=wrap)
    return sorted(topo.devices, key=lambda d: (d.process_index, tuple(reversed(getattr(d, "coords", ()))), d.id))
