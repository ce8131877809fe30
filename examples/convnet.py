"""A small ConvNet for 32x32 images, written the way flax's own nnx examples write models.

Train it under dp, fsdp, tp, zero1/zero2 or a 2-D mix of them with:

    shardbench train --model examples/convnet.py:build --task classify --data synthetic --devices 8 --strategy tp

Its parameters carry logical axis names through flax's sharding metadata: the dense layers use the
conventional 'embed', 'mlp' and 'classes'; the convolution kernels name their channels 'conv_in' and
'conv_out', which no strategy table knows, so they stay whole unless `--rules conv_out=mlp` maps them.
"""

from functools import partial

import jax.numpy as jnp
from flax import nnx

kernel_init = nnx.initializers.lecun_normal()


class CNN(nnx.Module):
  """Two convolutions with average pooling, then two dense layers."""

  def __init__(self, num_classes: int, *, features: int = 32, hidden: int = 256, dtype=jnp.float32,
               rngs: nnx.Rngs):
    conv_init = nnx.with_partitioning(kernel_init, (None, None, 'conv_in', 'conv_out'))
    self.conv1 = nnx.Conv(3, features, kernel_size=(3, 3), kernel_init=conv_init, dtype=dtype, rngs=rngs)
    self.conv2 = nnx.Conv(features, 2 * features, kernel_size=(3, 3), kernel_init=conv_init, dtype=dtype,
                          rngs=rngs)
    self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
    self.linear1 = nnx.Linear(8 * 8 * 2 * features, hidden,
                              kernel_init=nnx.with_partitioning(kernel_init, ('embed', 'mlp')),
                              bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), ('mlp',)),
                              dtype=dtype, rngs=rngs)
    self.linear2 = nnx.Linear(hidden, num_classes,
                              kernel_init=nnx.with_partitioning(kernel_init, ('mlp', 'classes')),
                              dtype=dtype, rngs=rngs)

  def __call__(self, x):
    x = self.avg_pool(nnx.relu(self.conv1(x)))
    x = self.avg_pool(nnx.relu(self.conv2(x)))
    x = x.reshape(x.shape[0], -1)  # flatten
    x = nnx.relu(self.linear1(x))
    return self.linear2(x)


def build(cfg, rngs):
  """shardbench's entry point: the run's configuration and its random streams in, the module out."""
  return CNN(cfg.model.num_classes, dtype=jnp.dtype(cfg.precision.dtype), rngs=rngs)


def flops_per_example(cfg):
  """Training FLOPs of one 32x32 image: 3 x the forward's multiply-adds x 2 (backward = 2 x forward)."""
  f, h, c = 32, 256, cfg.model.num_classes
  forward = 2 * (32 * 32 * 9 * 3 * f + 16 * 16 * 9 * f * 2 * f + 8 * 8 * 2 * f * h + h * c)
  return 3 * forward
