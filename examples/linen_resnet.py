"""A small ResNet written in flax linen, as flax's ImageNet example writes it, trained through the nnx bridge.

    shardbench train --model examples/linen_resnet.py:build --task classify --data synthetic --devices 8 \
        --strategy fsdp

Its `__call__(x, train)` takes linen's mode argument, declared below with `mode_argument = "train"` (or
`--model.mode-argument train`): shardbench passes train=True in the step and train=False in evaluation.
BatchNorm's `batch_stats` collection comes through the bridge as training state, updated by every step and
checkpointed; the bridge's RNG stream (the dropout before the head draws from it) advances every step.
"""

from functools import partial
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax.numpy as jnp
from flax import nnx

ModuleDef = Any

mode_argument = "train"  # the keyword of __call__ that says train (True) or evaluate (False)


class ResNetBlock(nn.Module):
  """A basic ResNet block."""

  filters: int
  conv: ModuleDef
  norm: ModuleDef
  act: Callable
  strides: tuple[int, int] = (1, 1)

  @nn.compact
  def __call__(self, x):
    residual = x
    y = self.conv(self.filters, (3, 3), self.strides)(x)
    y = self.norm()(y)
    y = self.act(y)
    y = self.conv(self.filters, (3, 3))(y)
    y = self.norm(scale_init=nn.initializers.zeros_init())(y)
    if residual.shape != y.shape:
      residual = self.conv(self.filters, (1, 1), self.strides, name='conv_proj')(residual)
      residual = self.norm(name='norm_proj')(residual)
    return self.act(residual + y)


class ResNet(nn.Module):
  """ResNet for small (32x32) images: a 3x3 stem, then stages of blocks, global pooling and a dense head."""

  stage_sizes: Sequence[int]
  num_classes: int
  num_filters: int = 16
  dropout_rate: float = 0.1
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool = True):
    conv = partial(nn.Conv, use_bias=False, dtype=self.dtype)
    norm = partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5, dtype=self.dtype)
    x = conv(self.num_filters, (3, 3), name='conv_init')(x)
    x = norm(name='bn_init')(x)
    x = nn.relu(x)
    for i, block_size in enumerate(self.stage_sizes):
      for j in range(block_size):
        strides = (2, 2) if i > 0 and j == 0 else (1, 1)
        x = ResNetBlock(self.num_filters * 2**i, strides=strides, conv=conv, norm=norm, act=nn.relu)(x)
    x = jnp.mean(x, axis=(1, 2))
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    head_init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('embed', 'classes'))
    return nn.Dense(self.num_classes, kernel_init=head_init, dtype=self.dtype)(x)


def build(cfg, rngs):
  """shardbench's entry point: the linen ResNet wrapped for nnx, its variables created from one sample."""
  model = nnx.bridge.ToNNX(ResNet(stage_sizes=(1, 1), num_classes=cfg.model.num_classes,
                                  dtype=jnp.dtype(cfg.precision.dtype)), rngs=rngs)
  size = cfg.data.image_size
  nnx.bridge.lazy_init(model, jnp.zeros((1, size, size, 3)), train=False)
  return model
