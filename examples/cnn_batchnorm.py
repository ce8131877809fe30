"""A CNN with BatchNorm and Dropout for 32x32 images, written the way flax's NNX tutorials write one.

Train it (here on CIFAR-10) with:

    shardbench train --model examples/cnn_batchnorm.py:build --task classify \
        --data imagefolder:../shared/data/cifar10-jpeg.tar.gz --devices 8 --strategy dp

BatchNorm's running statistics are training state: the step updates them, checkpoints keep them, and
evaluation normalises with them (shardbench calls `model.train()` for the step and `model.eval()` for
evaluation). Dropout draws its masks from the `rngs` that `__call__` takes, which shardbench builds from the
step's key, so every step draws new ones. No layer names a collective axis: under `--spmd jit` the statistics
span the global batch however it is split; under shard_map or pmap each device normalises with its own
examples' statistics (add `axis_name='batch'` to the BatchNorms there for global ones).
"""

from functools import partial

import jax.numpy as jnp
from flax import nnx

kernel_init = nnx.initializers.lecun_normal()


class CNN(nnx.Module):
  """Two convolution blocks (conv, BatchNorm, relu, pool, dropout), then two dense layers."""

  def __init__(self, num_classes: int, *, features: int = 32, hidden: int = 256, dropout: float = 0.1,
               dtype=jnp.float32, rngs: nnx.Rngs):
    conv_init = nnx.with_partitioning(kernel_init, (None, None, 'conv_in', 'conv_out'))
    # No bias before a BatchNorm: its shift replaces it (a bias there gets no gradient, only Adam's noise).
    self.conv1 = nnx.Conv(3, features, kernel_size=(3, 3), use_bias=False, kernel_init=conv_init, dtype=dtype,
                          rngs=rngs)
    self.batch_norm1 = nnx.BatchNorm(features, momentum=0.9, dtype=dtype, rngs=rngs)
    self.conv2 = nnx.Conv(features, 2 * features, kernel_size=(3, 3), use_bias=False, kernel_init=conv_init,
                          dtype=dtype, rngs=rngs)
    self.batch_norm2 = nnx.BatchNorm(2 * features, momentum=0.9, dtype=dtype, rngs=rngs)
    self.dropout1 = nnx.Dropout(rate=dropout)
    self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
    self.linear1 = nnx.Linear(8 * 8 * 2 * features, hidden,
                              kernel_init=nnx.with_partitioning(kernel_init, ('embed', 'mlp')),
                              bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), ('mlp',)),
                              dtype=dtype, rngs=rngs)
    self.dropout2 = nnx.Dropout(rate=2 * dropout)
    self.linear2 = nnx.Linear(hidden, num_classes,
                              kernel_init=nnx.with_partitioning(kernel_init, ('mlp', 'classes')),
                              dtype=dtype, rngs=rngs)

  def __call__(self, x, rngs: nnx.Rngs | None = None):
    x = self.avg_pool(nnx.relu(self.batch_norm1(self.conv1(x))))
    x = self.avg_pool(nnx.relu(self.batch_norm2(self.conv2(x))))
    x = self.dropout1(x, rngs=rngs)
    x = x.reshape(x.shape[0], -1)  # flatten
    x = self.dropout2(nnx.relu(self.linear1(x)), rngs=rngs)
    return self.linear2(x)


def build(cfg, rngs):
  """shardbench's entry point: the run's configuration and its random streams in, the module out."""
  return CNN(cfg.model.num_classes, dtype=jnp.dtype(cfg.precision.dtype), rngs=rngs)


def flops_per_example(cfg):
  """Training FLOPs of one 32x32 image: 3 x the forward's multiply-adds x 2 (backward = 2 x forward)."""
  f, h, c = 32, 256, cfg.model.num_classes
  forward = 2 * (32 * 32 * 9 * 3 * f + 16 * 16 * 9 * f * 2 * f + 8 * 8 * 2 * f * h + h * c)
  return 3 * forward
