"""An MLP classifier whose Dropout layers keep their own RNG stream, the idiom of flax's NNX guides.

    shardbench train --model examples/mlp_dropout.py:build --task classify --data synthetic --devices 8 \
        --strategy tp

`nnx.Dropout(rate, rngs=rngs)` holds a stream of its own; shardbench carries it in the training state, so it
advances every step (new masks each step, the same ones again after `--resume`). Evaluation runs with
`model.eval()`, which turns dropout off.
"""

import jax.numpy as jnp
from flax import nnx

kernel_init = nnx.initializers.lecun_normal()
zeros = nnx.initializers.zeros_init()


class MLP(nnx.Module):
  def __init__(self, din: int, hidden: int, classes: int, *, rate: float = 0.2, dtype=jnp.float32,
               rngs: nnx.Rngs):
    self.linear1 = nnx.Linear(din, hidden, kernel_init=nnx.with_partitioning(kernel_init, ('embed', 'mlp')),
                              bias_init=nnx.with_partitioning(zeros, ('mlp',)), dtype=dtype, rngs=rngs)
    self.dropout = nnx.Dropout(rate, rngs=rngs)
    self.linear2 = nnx.Linear(hidden, classes, kernel_init=nnx.with_partitioning(kernel_init, ('mlp', 'classes')),
                              dtype=dtype, rngs=rngs)

  def __call__(self, x):
    x = x.reshape(x.shape[0], -1)
    return self.linear2(self.dropout(nnx.relu(self.linear1(x))))


def build(cfg, rngs):
  """shardbench's entry point: the run's configuration and its random streams in, the module out."""
  size = cfg.data.image_size
  return MLP(size * size * 3, 128, cfg.model.num_classes, dtype=jnp.dtype(cfg.precision.dtype), rngs=rngs)
