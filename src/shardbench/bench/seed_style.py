"""The baseline written the way the seed notebooks write it: the same ViT, composed from stock nnx layers.

Patch embedding through `nnx.Conv`, the class token repeated with `jnp.tile`, each block an
`nnx.MultiHeadAttention` (separate query/key/value projections) and an MLP of `nnx.Linear`, GELU and
two `nnx.Dropout`s, blocks kept in a Python list and called in a Python loop, the step an `nnx.jit`
over `nnx.value_and_grad` and `nnx.Optimizer`. A compute dtype is passed to every layer as `dtype=`
(parameters stay float32), as the seeds' precision runs do. Shapes and the parameter count equal shardbench's
model; the optimizer is the very optax chain shardbench builds (AdamW, clipping, schedule).

Its inputs are already-normalised float32 images, as the seed's host pipeline hands over; shardbench's
step receives uint8 and augments on the device, so the comparison favours this baseline slightly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from shardbench.config import ModelConfig, OptimConfig
from shardbench.optim import build_optimizer


class PatchEmbedding(nnx.Module):
    def __init__(self, patch_size: int, embed_dim: int, *, rngs: nnx.Rngs, dtype: Any = jnp.float32) -> None:
        self.conv_proj = nnx.Conv(3, embed_dim, kernel_size=(patch_size, patch_size),
                                  strides=(patch_size, patch_size), padding="VALID", rngs=rngs, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.conv_proj(x)
        n, h, w, c = x.shape
        return jnp.reshape(x, (n, h * w, c))


class MLPBlock(nnx.Module):
    def __init__(self, embed_dim: int, mlp_dim: int, dropout_rate: float, *, rngs: nnx.Rngs,
                 dtype: Any = jnp.float32) -> None:
        self.fc1 = nnx.Linear(embed_dim, mlp_dim, rngs=rngs, dtype=dtype)
        self.dropout1 = nnx.Dropout(rate=dropout_rate, rngs=rngs)
        self.fc2 = nnx.Linear(mlp_dim, embed_dim, rngs=rngs, dtype=dtype)
        self.dropout2 = nnx.Dropout(rate=dropout_rate, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.dropout2(self.fc2(self.dropout1(nnx.gelu(self.fc1(x)))))


class EncoderBlock(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, dtype: Any = jnp.float32) -> None:
        e = cfg.embed_dim
        self.norm1 = nnx.LayerNorm(e, epsilon=1e-6, rngs=rngs, dtype=dtype)
        self.attn = nnx.MultiHeadAttention(num_heads=cfg.num_heads, in_features=e, decode=False, rngs=rngs,
                                           dtype=dtype)
        self.norm2 = nnx.LayerNorm(e, epsilon=1e-6, rngs=rngs, dtype=dtype)
        self.mlp = MLPBlock(e, cfg.mlp_dim, cfg.dropout, rngs=rngs, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class SeedViT(nnx.Module):
    def __init__(self, cfg: ModelConfig, image_size: int, *, rngs: nnx.Rngs, dtype: Any = jnp.float32) -> None:
        e = cfg.embed_dim
        num_patches = (image_size // cfg.patch_size) ** 2
        self.dtype = dtype
        self.patch_embed = PatchEmbedding(cfg.patch_size, e, rngs=rngs, dtype=dtype)
        self.cls_token = nnx.Param(jnp.zeros((1, 1, e)))
        self.pos_embed = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, num_patches + 1, e)))
        self.encoder_blocks = nnx.List([EncoderBlock(cfg, rngs=rngs, dtype=dtype) for _ in range(cfg.num_layers)])
        self.norm = nnx.LayerNorm(e, epsilon=1e-6, rngs=rngs, dtype=dtype)
        self.head = nnx.Linear(e, cfg.num_classes, rngs=rngs, dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.patch_embed(x.astype(self.dtype))
        cls_tokens = jnp.tile(self.cls_token[...].astype(self.dtype), (x.shape[0], 1, 1))
        x = jnp.concatenate((cls_tokens, x), axis=1) + self.pos_embed[...].astype(self.dtype)
        for block in self.encoder_blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


def count_params(model: nnx.Module) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def _loss_fn(model: SeedViT, images: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    logits = model(images).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=labels).mean(), logits


@nnx.jit
def train_step(model: SeedViT, optimizer: nnx.Optimizer, images: jax.Array, labels: jax.Array) -> jax.Array:
    (loss, _), grads = nnx.value_and_grad(_loss_fn, has_aux=True)(model, images, labels)
    optimizer.update(model, grads)
    return loss


def build(model_cfg: ModelConfig, optim_cfg: OptimConfig, *, image_size: int, total_steps: int,
          seed: int, dtype: str = "float32") -> tuple[SeedViT, nnx.Optimizer]:
    model = SeedViT(model_cfg, image_size, rngs=nnx.Rngs(seed), dtype=jnp.dtype(dtype))
    return model, nnx.Optimizer(model, build_optimizer(optim_cfg, total_steps), wrt=nnx.Param)


def prepare(model_cfg: ModelConfig, optim_cfg: OptimConfig, *, batch_size: int, image_size: int = 32,
            seed: int = 0, dtype: str = "float32") -> tuple[Callable[[], jax.Array], dict[str, Any]]:
    """Build the model and optimizer and run the first step (compilation included in `first_step_s`);
    returns a function running one more step and the figures to record."""
    model, optimizer = build(model_cfg, optim_cfg, image_size=image_size, total_steps=1000, seed=seed,
                             dtype=dtype)
    rng = np.random.default_rng(seed)
    images = jnp.asarray(rng.standard_normal((batch_size, image_size, image_size, 3), dtype=np.float32))
    labels = jnp.asarray(rng.integers(0, model_cfg.num_classes, batch_size, dtype=np.int32))
    start = time.perf_counter()
    train_step(model, optimizer, images, labels).block_until_ready()
    first = time.perf_counter() - start
    return (lambda: train_step(model, optimizer, images, labels)), {"first_step_s": first,
                                                                    "params": count_params(model)}
