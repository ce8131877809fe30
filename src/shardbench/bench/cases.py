"""What the benchmark measures, each built inside its own worker process (see `shardbench.bench.worker`).

A *contender* is prepared once (built, compiled, first step run) and then stepped on request, so the
driver can interleave the timed windows of several contenders: on a shared or throttling machine,
a slow minute then costs every contender alike instead of whichever ran during it.
A *one-shot* case (compile-only builds, the input pipeline) just returns its figures.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from shardbench.config import Config
from shardbench.data.arrays import ImageArrays
from shardbench.data.augment import CIFAR_MEAN, CIFAR_STD, augment
from shardbench.data.pipeline import make_batches
from shardbench.devices import select_devices
from shardbench.measure.timing import compile_timed
from shardbench.models.vit import flops_per_example
from shardbench.parallel.rules import make_layout
from shardbench.parsing import override
from shardbench.presets import get_preset
from shardbench.tasks import get_task
from shardbench.optim import build_optimizer
from shardbench.train.spmd import make_steps
from shardbench.models.spec import describe_model
from shardbench.train.state import abstract_train_state, init_state
from shardbench.train.step import place_batch

Result = dict[str, Any]


class Skipped(Exception):
    """A contender that cannot run here (e.g. torch is not installed): the message says why, in one line."""


def jax_matmul_label(matmul_precision: str, dtype: str = "float32") -> str:
    """What this process's JAX matmuls compute in (see `shardbench.bench.matmul`): for float32, by the
    precision and the first device; a 16-bit dtype is its own."""
    from shardbench.bench.matmul import jax_matmul

    if dtype != "float32":
        return dtype
    device = jax.devices()[0]
    capability = getattr(device, "compute_capability", None)
    try:
        parsed = tuple(int(v) for v in str(capability).split(".")[:2]) if capability else None
    except ValueError:
        parsed = None
    return jax_matmul(matmul_precision, device.platform, parsed if device.platform == "gpu" else None)


def jax_peak_bytes() -> int | None:
    """The first device's allocator peak where the backend keeps one (GPU, TPU; not the CPU)."""
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    return int(peak) if peak is not None else None


@dataclass
class Prepared:
    step: Callable[[], Any]  # one more unit of work; returns something to block on (or None)
    work_per_step: float  # images per step, or FLOPs per step for the matmul peak
    unit: str  # "images/s" or "FLOP/s"
    info: Result = field(default_factory=dict)
    wait: Callable[[Any], Any] = jax.block_until_ready  # waits for what `step` returned to be done
    peak_bytes: Callable[[], int | None] = jax_peak_bytes  # the device memory peak so far, where known


def bench_config(preset: str, overrides: dict[str, Any]) -> Config:
    return override(get_preset(preset), {"train.eval": False, "train.progress": False, **overrides})


def _train_flops(cfg: Config) -> int:
    return flops_per_example(cfg.model, cfg.data.image_size)["train"]


def random_batch(cfg: Config, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    size = cfg.data.image_size
    return {"image": rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8),
            "label": rng.integers(0, cfg.model.num_classes, batch).astype(np.int32),
            "mask": np.ones(batch, bool)}


def _steps(cfg: Config) -> tuple[Any, Any, Any, Any]:
    """shardbench's steps on one device, built by the functions `shardbench train` uses."""
    layout = make_layout("single", "none", select_devices(1))
    spec = describe_model(cfg)
    tx = build_optimizer(cfg.optim, 1000)
    steps = make_steps(cfg, get_task(cfg), spec, layout, tx, ("image", "label"))
    return layout, spec, tx, steps


def _compiled(cfg: Config, steps: Any, state: Any, batch: Any) -> tuple[Any, Result]:
    """Compile the train step for (state, batch); its compile time and compiled temporaries."""
    compiled, times = compile_timed(steps.train, state, batch)
    memory = compiled.memory_analysis()
    return compiled, {"compile_s": times.lower_s + times.compile_s, "lower_s": times.lower_s,
                      "temp_bytes": getattr(memory, "temp_size_in_bytes", None),
                      "train_flops_per_image": _train_flops(cfg), "batch_size": cfg.train.batch_size,
                      "num_layers": cfg.model.num_layers}


def shardbench_step(preset: str, overrides: dict[str, Any]) -> Prepared:
    cfg = bench_config(preset, overrides)
    layout, spec, tx, steps = _steps(cfg)
    state = init_state(cfg, spec, layout, tx)
    batch = steps.place(random_batch(cfg, cfg.train.batch_size))
    compiled, info = _compiled(cfg, steps, state, batch)
    holder = {"state": state}

    def step() -> Any:
        holder["state"], metrics = compiled(holder["state"], batch)
        return metrics["loss"]

    start = time.perf_counter()
    jax.block_until_ready(step())
    info["first_step_s"] = info["compile_s"] + time.perf_counter() - start
    info["matmul"] = jax_matmul_label(cfg.precision.matmul_precision, cfg.precision.dtype)
    return Prepared(step, cfg.train.batch_size, "images/s", info)


def seed_style_step(preset: str, overrides: dict[str, Any]) -> Prepared:
    from shardbench.bench import seed_style

    cfg = bench_config(preset, overrides)
    # The seed-style layers take no precision: this process's default gives them shardbench's.
    jax.config.update("jax_default_matmul_precision", cfg.precision.matmul_precision)
    step, info = seed_style.prepare(cfg.model, cfg.optim, batch_size=cfg.train.batch_size,
                                    image_size=cfg.data.image_size, dtype=cfg.precision.dtype)
    return Prepared(step, cfg.train.batch_size, "images/s", {
        **info, "train_flops_per_image": _train_flops(cfg),
        "matmul": jax_matmul_label(cfg.precision.matmul_precision, cfg.precision.dtype)})


def torch_step(preset: str, overrides: dict[str, Any], *, compile: bool, compile_mode: str = "default") -> Prepared:
    from shardbench.bench import torch_vit

    reason = torch_vit.available()
    if reason is not None:
        raise Skipped(reason)
    cfg = bench_config(preset, overrides)
    step, info, where = torch_vit.prepare(cfg.model, batch_size=cfg.train.batch_size, compile=compile,
                                          image_size=cfg.data.image_size, dtype=cfg.precision.dtype,
                                          matmul_precision=cfg.precision.matmul_precision, compile_mode=compile_mode)
    if cfg.precision.dtype != "float32":
        info["matmul"] = cfg.precision.dtype
    return Prepared(step, cfg.train.batch_size, "images/s", {**info, "train_flops_per_image": _train_flops(cfg)},
                    wait=lambda _: torch_vit.synchronize(where),
                    peak_bytes=lambda: torch_vit.peak_memory_bytes(where))


def matmul_peak(dtype: str, size: int = 0, min_step_s: float = 0.25, matmul_precision: str = "default") -> Prepared:
    """One large square matmul through JAX in `dtype` and `matmul_precision` per step (4096 on CPU, 8192
    elsewhere), repeated inside a step until a step lasts at least `min_step_s`, so the rate is not a
    dispatch-overhead figure."""
    from shardbench.models import PRECISIONS

    device = jax.devices()[0]
    n = size or (4096 if device.platform == "cpu" else 8192)
    key_a, key_b = jax.random.split(jax.random.key(0))
    a = jax.random.normal(key_a, (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(key_b, (n, n), jnp.float32).astype(dtype)
    mm = jax.jit(lambda x, y: jnp.matmul(x, y, precision=PRECISIONS[matmul_precision]))
    mm(a, b).block_until_ready()
    start = time.perf_counter()
    mm(a, b).block_until_ready()
    repeats = max(1, int(np.ceil(min_step_s / max(time.perf_counter() - start, 1e-6))))

    def step() -> Any:
        out = None
        for _ in range(repeats):
            out = mm(a, b)
        return out

    return Prepared(step, 2.0 * n**3 * repeats, "FLOP/s", {"size": n, "dtype": dtype, "repeats": repeats,
                                                          "device": device.device_kind,
                                                          "matmul": jax_matmul_label(matmul_precision, dtype)})


def compile_only(preset: str, overrides: dict[str, Any]) -> Result:
    """Compile time and compiled temporaries of shardbench's step, nothing executed."""
    cfg = bench_config(preset, overrides)
    layout, spec, tx, steps = _steps(cfg)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=layout.batch_sharding())
             for k, v in random_batch(cfg, cfg.train.batch_size).items()}
    return _compiled(cfg, steps, abstract_train_state(spec, layout, tx), batch)[1]


def input_pipeline(*, images: int, batch: int, seconds: float, one_core: bool) -> Result:
    """The host pipeline alone (seeded shuffle, batch gather, prefetch thread, hand-over to the device)
    over CIFAR-10-sized uint8 arrays, then the on-device augmentation of those batches."""
    rng = np.random.default_rng(0)
    arrays = ImageArrays(rng.integers(0, 256, (images, 32, 32, 3), dtype=np.uint8),
                         rng.integers(0, 10, images).astype(np.int32))
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    it = make_batches(arrays, global_batch=batch, seed=0, shuffle=True)
    placed = place_batch(next(it), sharding)
    jax.block_until_ready(placed)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        placed = place_batch(next(it), sharding)
        count += batch
    jax.block_until_ready(placed)
    host_rate = count / (time.perf_counter() - start)

    aug = jax.jit(lambda x, k: augment(x, k, scale=(0.9, 1.0), ratio=(0.9, 1.1), flip=True,
                                       mean=CIFAR_MEAN, std=CIFAR_STD, dtype=jnp.float32))
    images_dev = placed["image"]
    aug(images_dev, jax.random.key(0)).block_until_ready()
    rates = []
    for i in range(5):
        start = time.perf_counter()
        for j in range(20):
            out = aug(images_dev, jax.random.key(20 * i + j))
        out.block_until_ready()
        rates.append(20 * batch / (time.perf_counter() - start))
    return {"images_per_s": host_rate, "augment_images_per_s": float(np.median(rates)),
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "one_core": one_core, "batch_size": batch, "images": images}


CONTENDERS: dict[str, Callable[..., Prepared]] = {
    "shardbench": shardbench_step,
    "seed-style": seed_style_step,
    "torch": torch_step,
    "matmul-peak": matmul_peak,
}
ONE_SHOT: dict[str, Callable[..., Result]] = {
    "compile": compile_only,
    "pipeline": input_pipeline,
}
