"""A flax linen MLP classifier, brought to shardbench through flax's nnx bridge.

    shardbench train --model examples/linen_mlp.py:build --task classify --data synthetic --devices 8 --strategy tp

`nnx.bridge.ToNNX` wraps the linen module and `lazy_init` creates its parameters from one sample input; the
names given with `nn.with_logical_partitioning` come through as the nnx parameters' sharding metadata. The
wrapper keeps an RNG stream, which shardbench carries in the training state and advances every step (this
model draws no random numbers; `examples/linen_resnet.py` does, and keeps BatchNorm statistics too).
"""

import flax.linen as nn
import jax.numpy as jnp
from flax import nnx


class LinenMLP(nn.Module):
  hidden: int = 128
  classes: int = 10

  @nn.compact
  def __call__(self, x):
    x = x.reshape(x.shape[0], -1)
    x = nn.Dense(self.hidden, kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('embed', 'mlp')))(x)
    x = nn.relu(x)
    return nn.Dense(self.classes, kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('mlp', 'classes')))(x)


def build(cfg, rngs):
  model = nnx.bridge.ToNNX(LinenMLP(classes=cfg.model.num_classes), rngs=rngs)
  size = cfg.data.image_size
  nnx.bridge.lazy_init(model, jnp.zeros((1, size, size, 3)))
  return model
