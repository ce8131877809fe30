"""Choosing devices: simulated CPU devices on machines without accelerators, or the first N real ones."""

from __future__ import annotations

import jax

from shardbench.errors import ConfigError


def simulate_devices(count: int) -> None:
    """Ask JAX for `count` CPU devices. Works only before JAX has started its backends.

    Safe to call from a library before any other JAX call (`import shardbench; shardbench.simulate_devices(8)`).
    Where the backends are already up with another device count, say so instead of silently ignoring it.
    """
    if count <= 0:
        raise ConfigError(f"--devices must be positive, got {count}")
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:
        have = len(jax.devices("cpu"))
        if have < count:
            raise ConfigError(
                f"--devices {count}: JAX already started with {have} CPU devices; set --devices (or "
                f"shardbench.simulate_devices) before any other JAX call, or set "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={count}"
            ) from None


def select_devices(count: int) -> list[jax.Device]:
    """The first `count` devices of the default backend (0 = all of them)."""
    devices = jax.devices()
    if count == 0:
        return devices
    if count > len(devices):
        raise ConfigError(
            f"--devices {count}: only {len(devices)} {devices[0].platform} device(s) are available"
        )
    return devices[:count]
