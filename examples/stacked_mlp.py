"""A regression MLP whose hidden layers are stacked on a 'layers' axis and run through shardbench's `run_stack`,
so that the pipeline strategies can split them into stages:

    shardbench train --model examples/stacked_mlp.py:build --task regress --data regression \
        --model.num-layers 9 --devices 4 --strategy pp --mesh stage=4 --parallel.microbatches 8

What a pipeline needs of a model of your own: every stacked parameter has 'layers' as its first dimension's
name, and the model hands the stack to `run_stack(run, x, layers)` once, where `run(h, layers)` runs every layer
on `h` as a pure function of its arguments (a scan, no random numbers, no variables of its own). Without
stages `run_stack` just calls `run(x, layers)`; under `pp` and its combinations shardbench runs it stage by stage.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from shardbench.models.axes import run_stack

kernel_init = nnx.initializers.lecun_normal()
zeros = nnx.initializers.zeros_init()


class StackedMLP(nnx.Module):
  def __init__(self, din: int, width: int, depth: int, dout: int, *, dtype=jnp.float32, rngs: nnx.Rngs):
    self.first = nnx.Linear(din, width, kernel_init=nnx.with_partitioning(kernel_init, ('features', 'mlp')),
                            bias_init=nnx.with_partitioning(zeros, ('mlp',)), dtype=dtype, rngs=rngs)
    # depth hidden layers, one kernel and one bias each, drawn independently and stacked on 'layers'
    init = jax.vmap(lambda key: kernel_init(key, (width, width)))
    self.kernels = nnx.Param(init(jax.random.split(rngs.params(), depth)), sharding_names=('layers', 'embed', 'mlp'))
    self.biases = nnx.Param(jnp.zeros((depth, width)), sharding_names=('layers', 'mlp'))
    self.last = nnx.Linear(width, dout, kernel_init=nnx.with_partitioning(kernel_init, ('mlp', 'classes')),
                           dtype=dtype, rngs=rngs)

  def __call__(self, x):
    h = nnx.relu(self.first(x))

    def run(h, layers):
      def layer(h, p):
        return jnp.tanh(h @ p['kernel'] + p['bias']), None
      return jax.lax.scan(layer, h, layers)[0]

    h = run_stack(run, h, {'kernel': self.kernels[...], 'bias': self.biases[...]})
    return self.last(h)


def build(cfg, rngs):
  """shardbench's entry point: --model.num-layers - 1 stacked hidden layers of --model.mlp-dim, as the built-in
  mlp stacks them."""
  m = cfg.model
  return StackedMLP(m.input_dim, m.mlp_dim, m.num_layers - 1, m.num_classes, dtype=jnp.dtype(cfg.precision.dtype),
                    rngs=rngs)
