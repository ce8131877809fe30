"""Image classification with the Vision Transformer: uint8 images augmented and normalised on the device,
softmax cross-entropy over the classes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from shardbench.config import Config
from shardbench.data import recipe
from shardbench.data.augment import CIFAR_MEAN, CIFAR_STD, augment, normalize, normalize_float
from shardbench.errors import ConfigError
from shardbench.models.transformer import check_heads
from shardbench.models.vit import flops_per_example
from shardbench.tasks.base import Batch, Rows, Task, Terms


def check(cfg: Config) -> None:
    m = cfg.model
    if m.stem != "conv" and cfg.data.image_size % m.patch_size:  # the conv stem's max-pools round the side up
        raise ConfigError(f"--data.image-size {cfg.data.image_size} is not divisible by --model.patch-size "
                          f"{m.patch_size}: pick a patch size that divides it")
    check_heads(m)


def inputs(cfg: Config, batch: Batch, key: jax.Array, train: bool, rows: Rows,
           mean: tuple[float, ...] = CIFAR_MEAN, std: tuple[float, ...] = CIFAR_STD) -> jax.Array:
    """uint8 images, augmented (training) and normalised with the dataset's statistics (see `for_data`). The
    recipe's mixing may depend on where the step is in training (`rows.step` of `rows.steps`)."""
    data, dtype = cfg.data, jnp.dtype(cfg.precision.dtype)
    if train and recipe.uses_recipe(data):
        images = recipe.recipe_images(data, batch["image"], key, (rows.offset, rows.total), (rows.step, rows.steps),
                                      mean, std)
        return normalize_float(images / 255.0, mean, std, dtype)
    if train and data.augment:
        return augment(batch["image"], key, scale=data.crop_scale, ratio=data.crop_ratio, flip=data.flip,
                       mean=mean, std=std, dtype=dtype, rows=(rows.offset, rows.total))
    return normalize(batch["image"], mean, std, dtype)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-position cross-entropy, always in float32."""
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)


def targets(cfg: Config, batch: Batch, key: jax.Array, rows: Rows) -> Batch:
    """In training, soft targets where images are mixed or labels smoothed (`soft`); else the batch as is."""
    smoothing = cfg.train.label_smoothing
    if cfg.data.mixup <= 0 and smoothing <= 0:
        return batch
    soft = recipe.soft_targets(cfg.data, batch["label"], cfg.model.num_classes, smoothing, key,
                               (rows.offset, rows.total), (rows.step, rows.steps))
    return {**batch, "soft": soft}


def terms(logits: jax.Array, batch: Batch) -> Terms:
    """Cross-entropy against the label, or against the soft targets where training made some; accuracy is
    always against the image's own label."""
    labels = batch["label"]
    loss = (optax.softmax_cross_entropy(logits.astype(jnp.float32), batch["soft"]) if "soft" in batch
            else cross_entropy(logits, labels))
    return Terms(loss, jnp.ones(labels.shape, jnp.float32), (logits.argmax(-1) == labels).astype(jnp.float32))


TASK = Task(
    kind="vit", unit="images", check=check, inputs=inputs, terms=terms, targets=targets,
    train_flops_per_example=lambda cfg: flops_per_example(cfg.model, cfg.data.image_size)["train"],
    units_per_example=lambda cfg: 1,
    formula="3 x batch x [stem + L*(8*T*E^2 + 4*T^2*E + 4*T*E*M) + pool + 2*E*C], stem = 2*N*3*p^2*E for "
            "patches (2*N*15*p^2*E shifted-patch; conv: 2*side^2*9*C_in*C_out per layer), N=(image/p)^2 patches "
            "((image/2^layers)^2 for the conv stem), T=N+1 tokens (N with --model.pool mean or sequence), pool = "
            "4*T*E for --model.pool sequence, else 0 (matmul FLOPs; backward = 2 x forward)",
)
