"""The seeds' Vision Transformer, written afresh in flax nnx with logical axis names on every parameter.

Layers are stacked along a leading 'layers' dimension and run under `jax.lax.scan`, so compile time
does not grow with depth. The parameter count equals the seed notebook's model summary
(10,695,562 for the `vit-seed` shapes): patch embedding as a 4x4 conv kernel, class token, learned
position embedding, per block two LayerNorms, q/k/v and output projections with biases, a two-layer
GELU MLP, and a final LayerNorm and classifier head.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from shardbench.config import ModelConfig
from shardbench.models.axes import (
    BATCH, CLASSES, EMBED, HEADS, KV, LAYERS, MLP, NORM, PATCH, SEQ, Axes, constrain,
)

# Which configuration field each logical axis comes from: used to explain a layout that cannot divide.
AXIS_FIELDS: dict[str, str] = {
    EMBED: "model.embed_dim", MLP: "model.mlp_dim", HEADS: "model.num_heads", CLASSES: "model.num_classes",
}
LN_EPSILON = 1e-6


def _kernel_init(in_axis: int | tuple[int, ...], out_axis: int | tuple[int, ...],
                 batch_axis: tuple[int, ...] = ()) -> jax.nn.initializers.Initializer:
    """Xavier-uniform over the named fan-in/fan-out dims; stacked-layer dims are independent draws."""
    return jax.nn.initializers.variance_scaling(
        1.0, "fan_avg", "uniform", in_axis=in_axis, out_axis=out_axis, batch_axis=batch_axis
    )


def _param(value: jax.Array, axes: Axes, dtype: jnp.dtype) -> nnx.Param:
    assert value.ndim == len(axes), (value.shape, axes)
    return nnx.Param(value.astype(dtype), axes=axes)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    """LayerNorm computed in float32 whatever the compute dtype, cast back afterwards."""
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + LN_EPSILON) * scale.astype(jnp.float32) + bias.astype(jnp.float32)
    return y.astype(x.dtype)


# Largest depth that `unroll=0` (auto) unrolls completely; deeper stacks keep a rolled loop.
AUTO_UNROLL_MAX_LAYERS = 8


def layers_per_iteration(cfg: ModelConfig) -> int:
    """How many layers one scan iteration runs: `cfg.unroll`, or for 0 (auto) every layer up to
    AUTO_UNROLL_MAX_LAYERS without --remat, else 1. Unrolled layers run faster (no loop-carried
    stacking of activations); a rolled loop keeps compile time flat as depth grows, and --remat needs
    it on CPU: XLA's CPU compiler drops the optimization barriers that keep a checkpointed block's
    recomputation apart, so without a loop boundary it merges the recomputation back into the forward
    pass and nothing is saved (measured: vit-tiny at batch 128 keeps 460 MiB of temporaries either way)."""
    if cfg.unroll > 0:
        return min(cfg.unroll, cfg.num_layers)
    if cfg.remat != "none":
        return 1
    return cfg.num_layers if cfg.num_layers <= AUTO_UNROLL_MAX_LAYERS else 1


def _mix32(x: jax.Array) -> jax.Array:
    """murmur3's 32-bit finaliser: a bijection on uint32 whose output bits each depend on every input bit."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def keep_mask(key: jax.Array, shape: tuple[int, ...], keep: float) -> jax.Array:
    """Bernoulli(keep) booleans from a counter-based hash of each element's flat index.

    On two CPU cores, dropout on one 128x65x1536 array took 159 ms with threefry's Bernoulli mask and
    7.2 ms with this one (5.3 ms for the rescaling alone): hashing the index with a per-call seed drawn
    from `key` costs a few integer operations per element and fuses into the consumer. It is just as
    reproducible: the same key gives
    the same mask on any mesh, since the index is the element's global position.
    """
    seed = jax.random.bits(key, (2,), jnp.uint32)
    index = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for dim in reversed(range(len(shape))):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, dim) * jnp.uint32(stride % 2**32)
        stride *= shape[dim]
    bits = _mix32(_mix32(index ^ seed[0]) + seed[1])
    threshold = min(int(round(keep * 2.0**32)), 2**32 - 1)
    return bits < jnp.uint32(threshold)


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    if key is None or rate == 0.0:
        return x
    return jnp.where(keep_mask(key, x.shape, 1.0 - rate), x / (1.0 - rate), jnp.zeros_like(x))


# What a block keeps for the backward pass under each --remat setting (None = no checkpointing).
REMAT = {
    "none": None,
    # Keep the matmul outputs, recompute LayerNorm, softmax, GELU and dropout: less memory, ~no extra FLOPs.
    "block": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    # Keep only each block's input and recompute the whole block: least memory, one more forward pass.
    "full": jax.checkpoint_policies.nothing_saveable,
}


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, fused: bool,
              precision: jax.lax.Precision) -> jax.Array:
    """Softmax attention over (batch, seq, heads, head_dim) q/k/v. `fused` calls
    jax.nn.dot_product_attention, which runs cuDNN's fused kernel on NVIDIA GPUs (and XLA's own
    composition elsewhere); otherwise two einsums with float32 scores."""
    if fused:
        return jax.nn.dot_product_attention(q, k, v)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=precision,
                        preferred_element_type=jnp.float32) / math.sqrt(q.shape[-1])
    weights = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v, precision=precision)


class EncoderStack(nnx.Module):
    """`num_layers` pre-LayerNorm encoder blocks, each parameter stacked on a leading 'layers' dim."""

    def __init__(self, cfg: ModelConfig, *, param_dtype: jnp.dtype, fused_attention: bool, rngs: nnx.Rngs) -> None:
        n, e, h, m = cfg.num_layers, cfg.embed_dim, cfg.num_heads, cfg.mlp_dim
        d = e // h
        ones, zeros = jnp.ones, jnp.zeros
        self.ln1_scale = _param(ones((n, e)), (LAYERS, NORM), param_dtype)
        self.ln1_bias = _param(zeros((n, e)), (LAYERS, NORM), param_dtype)
        qkv = _kernel_init(1, (3, 4), (0, 2))(rngs.params(), (n, e, 3, h, d))
        self.qkv_kernel = _param(qkv, (LAYERS, EMBED, None, HEADS, KV), param_dtype)
        self.qkv_bias = _param(zeros((n, 3, h, d)), (LAYERS, None, HEADS, KV), param_dtype)
        out = _kernel_init((1, 2), 3, (0,))(rngs.params(), (n, h, d, e))
        self.out_kernel = _param(out, (LAYERS, HEADS, KV, EMBED), param_dtype)
        self.out_bias = _param(zeros((n, e)), (LAYERS, EMBED), param_dtype)
        self.ln2_scale = _param(ones((n, e)), (LAYERS, NORM), param_dtype)
        self.ln2_bias = _param(zeros((n, e)), (LAYERS, NORM), param_dtype)
        self.mlp1_kernel = _param(_kernel_init(1, 2, (0,))(rngs.params(), (n, e, m)), (LAYERS, EMBED, MLP),
                                  param_dtype)
        self.mlp1_bias = _param(zeros((n, m)), (LAYERS, MLP), param_dtype)
        self.mlp2_kernel = _param(_kernel_init(1, 2, (0,))(rngs.params(), (n, m, e)), (LAYERS, MLP, EMBED),
                                  param_dtype)
        self.mlp2_bias = _param(zeros((n, e)), (LAYERS, EMBED), param_dtype)
        self.num_heads = h
        self.dropout_rate = cfg.dropout
        self.unroll = layers_per_iteration(cfg)
        self.remat = cfg.remat
        self.fused_attention = fused_attention

    def __call__(self, x: jax.Array, *, rng: jax.Array | None, precision: jax.lax.Precision) -> jax.Array:
        names = ("ln1_scale", "ln1_bias", "qkv_kernel", "qkv_bias", "out_kernel", "out_bias",
                 "ln2_scale", "ln2_bias", "mlp1_kernel", "mlp1_bias", "mlp2_kernel", "mlp2_bias")
        stacked = {name: getattr(self, name)[...] for name in names}
        num_layers = stacked["ln1_scale"].shape[0]
        keys = None if rng is None else jax.random.split(rng, num_layers)
        dtype, rate, fused = x.dtype, self.dropout_rate, self.fused_attention

        def block(x: jax.Array, layer: tuple[dict[str, jax.Array], jax.Array | None]) -> tuple[jax.Array, None]:
            p, key = layer
            p = {k: v.astype(dtype) for k, v in p.items()}
            k1, k2 = (None, None) if key is None else jax.random.split(key)
            h = layer_norm(x, p["ln1_scale"], p["ln1_bias"])
            qkv = jnp.einsum("bse,ethd->tbshd", h, p["qkv_kernel"], precision=precision)
            qkv = qkv + p["qkv_bias"][:, None, None]
            q, k, v = (constrain(t, (BATCH, SEQ, HEADS, KV)) for t in qkv)
            attn = attention(q, k, v, fused=fused, precision=precision)
            attn = jnp.einsum("bqhd,hde->bqe", attn, p["out_kernel"], precision=precision) + p["out_bias"]
            x = constrain(x + attn, (BATCH, SEQ, EMBED))
            h = layer_norm(x, p["ln2_scale"], p["ln2_bias"])
            h = jnp.einsum("bse,em->bsm", h, p["mlp1_kernel"], precision=precision) + p["mlp1_bias"]
            h = constrain(dropout(jax.nn.gelu(h), rate, k1), (BATCH, SEQ, MLP))
            h = jnp.einsum("bsm,me->bse", h, p["mlp2_kernel"], precision=precision) + p["mlp2_bias"]
            x = constrain(x + dropout(h, rate, k2), (BATCH, SEQ, EMBED))
            return x, None

        if REMAT[self.remat] is not None:
            block = jax.checkpoint(block, policy=REMAT[self.remat])
        x, _ = jax.lax.scan(block, x, (stacked, keys), unroll=self.unroll)
        return x


class VisionTransformer(nnx.Module):
    """Patch embedding + class token + learned positions -> encoder stack -> LayerNorm -> linear head."""

    def __init__(self, cfg: ModelConfig, *, image_size: int, dtype: jnp.dtype = jnp.float32,
                 param_dtype: jnp.dtype = jnp.float32,
                 precision: jax.lax.Precision = jax.lax.Precision.DEFAULT, fused_attention: bool = False,
                 rngs: nnx.Rngs) -> None:
        p, e = cfg.patch_size, cfg.embed_dim
        num_patches = (image_size // p) ** 2
        patch = _kernel_init((0, 1, 2), 3)(rngs.params(), (p, p, 3, e))
        self.patch_kernel = _param(patch, (None, None, PATCH, EMBED), param_dtype)
        self.patch_bias = _param(jnp.zeros((e,)), (EMBED,), param_dtype)
        self.cls_token = _param(jnp.zeros((1, 1, e)), (None, None, EMBED), param_dtype)
        pos = 0.02 * jax.random.truncated_normal(rngs.params(), -2.0, 2.0, (1, num_patches + 1, e))
        self.pos_embed = _param(pos, (None, SEQ, EMBED), param_dtype)
        self.encoder = EncoderStack(cfg, param_dtype=param_dtype, fused_attention=fused_attention, rngs=rngs)
        self.norm_scale = _param(jnp.ones((e,)), (NORM,), param_dtype)
        self.norm_bias = _param(jnp.zeros((e,)), (NORM,), param_dtype)
        head = _kernel_init(0, 1)(rngs.params(), (e, cfg.num_classes))
        self.head_kernel = _param(head, (EMBED, CLASSES), param_dtype)
        self.head_bias = _param(jnp.zeros((cfg.num_classes,)), (CLASSES,), param_dtype)
        self.patch_size = p
        self.dtype = dtype
        self.precision = precision

    def __call__(self, images: jax.Array, *, rng: jax.Array | None = None) -> jax.Array:
        """images: (batch, H, W, 3), already normalised. rng=None means no dropout. Returns float32 logits."""
        dtype, precision, p = self.dtype, self.precision, self.patch_size
        b, height, width, c = images.shape
        # Patchify with a reshape: the same arithmetic as a stride-p 'VALID' conv, and one plain matmul.
        x = images.astype(dtype).reshape(b, height // p, p, width // p, p, c)
        x = x.transpose(0, 1, 3, 2, 4, 5).reshape(b, (height // p) * (width // p), p * p * c)
        kernel = self.patch_kernel[...].astype(dtype).reshape(p * p * c, -1)
        x = jnp.einsum("bnp,pe->bne", x, kernel, precision=precision) + self.patch_bias[...].astype(dtype)
        cls = jnp.broadcast_to(self.cls_token[...].astype(dtype), (b, 1, x.shape[-1]))
        x = jnp.concatenate([cls, x], axis=1) + self.pos_embed[...].astype(dtype)
        x = constrain(x, (BATCH, SEQ, EMBED))
        x = self.encoder(x, rng=rng, precision=precision)
        x = layer_norm(x[:, 0], self.norm_scale[...], self.norm_bias[...])
        logits = jnp.einsum("be,ec->bc", x, self.head_kernel[...].astype(dtype), precision=precision)
        return (logits + self.head_bias[...].astype(dtype)).astype(jnp.float32)


def count_params(model: nnx.Module) -> int:
    """Number of parameter elements (works on abstract models from nnx.eval_shape too)."""
    state = nnx.state(model, nnx.Param)
    return sum(math.prod(x.shape) for x in jax.tree.leaves(state))


def flops_per_example(cfg: ModelConfig, image_size: int) -> dict[str, int]:
    """Matmul FLOPs (2 per multiply-add) of one image, forward and train (backward = 2 x forward).

    With N = (image_size / patch)^2 patches, T = N + 1 tokens, E = embed, M = mlp, L = layers, C = classes:
    forward = 2*N*(3*patch^2)*E + L*(8*T*E^2 + 4*T^2*E + 4*T*E*M) + 2*E*C
    (q/k/v and output projections 8*T*E^2, scores and weighted sum 4*T^2*E, MLP 4*T*E*M).
    Element-wise work (LayerNorm, softmax, GELU, the optimizer) is left out, as MFU conventions do.
    """
    p, e, m, n_layers = cfg.patch_size, cfg.embed_dim, cfg.mlp_dim, cfg.num_layers
    patches = (image_size // p) ** 2
    tokens = patches + 1
    forward = (2 * patches * 3 * p * p * e
               + n_layers * (8 * tokens * e * e + 4 * tokens * tokens * e + 4 * tokens * e * m)
               + 2 * e * cfg.num_classes)
    return {"forward": forward, "train": 3 * forward}
