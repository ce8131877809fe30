"""shardbench: train and compare JAX models under any device mesh, sharding strategy and precision.

Importing this package imports no JAX (nor starts a backend), so `shardbench.simulate_devices(8)` still works
afterwards, and the command line reads its arguments before JAX's libraries are imported.
"""

from __future__ import annotations

from shardbench.config import Config
from shardbench.devices import simulate_devices
from shardbench.parsing import override
from shardbench.presets import get_preset

__version__ = "0.1.0"
__all__ = ["Config", "get_preset", "override", "simulate_devices", "train", "__version__"]


def train(cfg: Config) -> dict:
    """Run one training as `cfg` describes and return its summary (also saved in the run directory)."""
    from shardbench.train.loop import run

    return run(cfg)
