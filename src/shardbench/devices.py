"""Choosing devices: simulated CPU devices on machines without accelerators, or the first N real ones."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from shardbench.errors import ConfigError

if TYPE_CHECKING:
    import jax

# The most CPU devices XLA is asked to simulate: its start-up grows faster than the count (on a 2-core Xeon, 1.2 s
# for 2,048 devices, 13 s for 4,096, over two minutes for 8,192: a --devices of 99999 seemed to hang).
MAX_SIMULATED = 4096


_planned: int | None = None  # `planned_processes`: the processes of a run checked before it starts


def process_count() -> int:
    """The processes of this run: JAX's count, or, while a sweep checks a run in one process before starting it,
    the count that run will have (`planned_processes`)."""
    if _planned:
        return _planned
    import jax  # here, not at the top: `import shardbench` and the command line's parser stay free of JAX

    return jax.process_count()


@contextlib.contextmanager
def planned_processes(count: int) -> Iterator[None]:
    """Meanwhile the checks that depend on the process count (`process_count`) see `count` processes."""
    global _planned
    before, _planned = _planned, count
    try:
        yield
    finally:
        _planned = before


def check_split(count: int, processes: int, per_process: int) -> None:
    """A run of `count` devices (0: all) over `processes` processes of `per_process` devices each (0: the count
    split evenly), refused as its processes would refuse it once joined."""
    if processes <= 1:
        return
    if per_process <= 0:
        if count > 0 and count % processes:
            raise ConfigError(f"--devices {count} does not split evenly over {processes} processes: use a multiple "
                              f"of {processes}")
        return
    if count not in (0, processes * per_process):
        raise ConfigError(_not_all(count, processes, processes * per_process))


def _not_all(count: int, processes: int, total: int) -> str:
    instead = "fewer processes" if count < total else "more processes, or more devices in each"
    return (f"--devices {count}: a run of {processes} processes uses all of their {total} devices; pass "
            f"--devices {total} (or 0), or start {instead}")


def simulate_devices(count: int) -> None:
    """Ask JAX for `count` CPU devices. Works only before JAX has started its backends.

    Safe to call from a library before any other JAX call (`import shardbench; shardbench.simulate_devices(8)`).
    Where the backends are already up with another device count, say so instead of silently ignoring it.
    """
    if count <= 0:
        raise ConfigError(f"--devices must be positive, got {count}")
    if count > MAX_SIMULATED:  # an accelerator's count, or refused by `select_devices` where the run is on the CPU
        return
    import jax

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


def leave_out_absent_tpu() -> None:
    """Where libtpu is installed (the `tpu` extra, to plan for a TPU slice) on a host with no TPU chip, JAX would
    still try to start a TPU backend with every command: libtpu prints a page of warnings and an
    "INVALID_ARGUMENT" line before the command's own output, and holds /tmp/libtpu_lockfile. JAX's own check of
    the host's PCI devices finds no chip there, so the TPU backend's start is made to fail at once, quietly, as
    JAX's own start of an absent TPU does (`_no_tpu_chip`). The platform stays known to JAX: modules imported
    later still register their TPU lowerings (flax imports jax.extend, whose checkify does; with the platform
    left out, that import failed). Compiling for a TPU slice (`shardbench.plan.tpu`) loads libtpu by itself and
    is unchanged. Nothing is changed where JAX_PLATFORMS (or jax_platforms) names the platforms,
    JAX_FORCE_TPU_INIT is set, or the backends have started; JAX's internals moving is no error, only the
    warnings come back. Where libtpu is not installed (as a package, or at TPU_LIBRARY_PATH), or JAX_PLATFORMS is
    set, JAX is not even imported here. The command line calls this only where JAX will start in its process, and
    `train` and `inspect` after checking their flags: a refusal imports no JAX even where libtpu is installed."""
    if (os.environ.get("JAX_PLATFORMS") or "JAX_FORCE_TPU_INIT" in os.environ
            or (importlib.util.find_spec("libtpu") is None and not os.environ.get("TPU_LIBRARY_PATH"))):
        return
    import jax

    if jax.config.jax_platforms:
        return
    try:
        from jax._src import hardware_utils, xla_bridge

        if xla_bridge.backends_are_initialized() or hardware_utils.num_available_tpu_chips_and_device_id()[0]:
            return
        registration = xla_bridge._backend_factories.get("tpu")
        if registration is not None:
            registration.factory = _no_tpu_chip
            registration.fail_quietly = True
    except (ImportError, AttributeError, OSError):
        return


def _no_tpu_chip() -> None:
    raise RuntimeError("no TPU chip on this host (shardbench.devices.leave_out_absent_tpu)")


def select_devices(count: int) -> list[jax.Device]:
    """The first `count` devices of the default backend (0 = all of them), ordered by process, so that a mesh
    built from them spans processes along its outer (data) axis first.

    A run of several processes uses every device of every process: a process whose devices were left out
    would have no part of the program to run."""
    import jax

    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    processes = jax.process_count()
    each = [sum(d.process_index == p for d in devices) for p in sorted({d.process_index for d in devices})]
    if len(set(each)) > 1:  # every process sees every device: each refuses alike, none waits on another
        raise ConfigError(f"the {processes} processes have unequal devices ({', '.join(map(str, each))}): a mesh "
                          f"over them needs the same count in each; give every process the same "
                          f"(SHARDBENCH_LOCAL_DEVICES, or launch's --devices-per-process)")
    if processes > 1 and count not in (0, len(devices)):
        raise ConfigError(_not_all(count, processes, len(devices)))
    if count == 0:
        return devices
    if count > len(devices):
        simulated = devices[0].platform == "cpu" and count > MAX_SIMULATED
        raise ConfigError(
            f"--devices {count}: at most {MAX_SIMULATED} CPU devices are simulated (XLA's start-up grows faster than "
            f"their count); use {MAX_SIMULATED} or fewer" if simulated else
            f"--devices {count}: only {len(devices)} {devices[0].platform} device(s) are available"
        )
    return devices[:count]
