"""The seed's very deep MLP in flax nnx: `num_layers` ReLU layers of width `mlp_dim` on `input_dim`
inputs, then a linear output layer of `num_classes` values.

The first layer maps the inputs to the width; the other num_layers - 1 are square and stacked on a
leading 'layers' dimension, run under `jax.lax.scan`, so 90 layers compile as fast as 2. Each square
kernel is (embed, mlp): tensor parallelism splits its output features over the model axis and the
layer's output is gathered back to a whole (batch, embed) activation before the next layer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from shardbench.config import ModelConfig
from shardbench.errors import ConfigError
from shardbench.models.axes import BATCH, CLASSES, EMBED, FEATURES, LAYERS, MLP, constrain
from shardbench.models.transformer import dropout, kernel_init, layers_per_iteration, param, scan_layers

AXIS_FIELDS: dict[str, str] = {MLP: "model.mlp_dim", EMBED: "model.mlp_dim", CLASSES: "model.num_classes"}


class DeepMLP(nnx.Module):
    """inputs (batch, input_dim) float -> outputs (batch, num_classes) in float32."""

    def __init__(self, cfg: ModelConfig, *, dtype: jnp.dtype = jnp.float32, param_dtype: jnp.dtype = jnp.float32,
                 precision: jax.lax.Precision = jax.lax.Precision.DEFAULT, rngs: nnx.Rngs) -> None:
        w, depth = cfg.mlp_dim, cfg.num_layers - 1
        self.in_kernel = param(kernel_init(0, 1)(rngs.params(), (cfg.input_dim, w)), (FEATURES, MLP), param_dtype)
        self.in_bias = param(jnp.zeros((w,)), (MLP,), param_dtype)
        hidden = kernel_init(1, 2, (0,))(rngs.params(), (depth, w, w))
        self.hidden_kernel = param(hidden, (LAYERS, EMBED, MLP), param_dtype)
        self.hidden_bias = param(jnp.zeros((depth, w)), (LAYERS, MLP), param_dtype)
        self.out_kernel = param(kernel_init(0, 1)(rngs.params(), (w, cfg.num_classes)), (EMBED, CLASSES),
                                param_dtype)
        self.out_bias = param(jnp.zeros((cfg.num_classes,)), (CLASSES,), param_dtype)
        self.dropout_rate = cfg.dropout
        self.unroll = layers_per_iteration(cfg, depth)
        self.remat = cfg.remat
        self.dtype = dtype
        self.precision = precision

    def __call__(self, inputs: jax.Array, *, rng: jax.Array | None = None) -> jax.Array:
        dtype, precision, rate = self.dtype, self.precision, self.dropout_rate
        depth = self.hidden_kernel.shape[0]
        keys = None if rng is None else jax.random.split(rng, depth + 1)

        def dense(x: jax.Array, kernel: jax.Array, bias: jax.Array, key: jax.Array | None) -> jax.Array:
            h = jnp.einsum("bi,io->bo", x, kernel.astype(dtype), precision=precision) + bias.astype(dtype)
            h = constrain(jax.nn.relu(h), (BATCH, MLP))
            return constrain(dropout(h, rate, key), (BATCH, EMBED))

        def layer(x: jax.Array, p: tuple[jax.Array, jax.Array, jax.Array | None]) -> tuple[jax.Array, None]:
            return dense(x, *p), None

        x = constrain(inputs.astype(dtype), (BATCH, FEATURES))
        x = dense(x, self.in_kernel[...], self.in_bias[...], None if keys is None else keys[0])
        stacked = (self.hidden_kernel[...], self.hidden_bias[...], None if keys is None else keys[1:])
        x = scan_layers(layer, x, stacked, remat=self.remat, unroll=self.unroll)
        out = jnp.einsum("bw,wc->bc", x, self.out_kernel[...].astype(dtype), precision=precision)
        return (out + self.out_bias[...].astype(dtype)).astype(jnp.float32)


def check_options(cfg: ModelConfig) -> None:
    """The MLP's own rule: its layers are the input layer and a stack of square ones, at least one (a stack of
    none failed in its initialiser, "float division by zero")."""
    if cfg.num_layers < 2:
        raise ConfigError(f"--model.num-layers {cfg.num_layers}: the mlp is an input layer and a stack of square "
                          f"layers of width --model.mlp-dim after it (its output layer comes on top), so it needs at "
                          f"least 2: give 2 or more")


def flops_per_example(cfg: ModelConfig) -> dict[str, int]:
    """Matmul FLOPs of one example: 2*(I*W + (L-1)*W^2 + W*C) forward; train = 3 x forward."""
    w = cfg.mlp_dim
    forward = 2 * (cfg.input_dim * w + (cfg.num_layers - 1) * w * w + w * cfg.num_classes)
    return {"forward": forward, "train": 3 * forward}
