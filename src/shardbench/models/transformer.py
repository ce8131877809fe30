"""Pieces every model here is built from: initialisers, LayerNorm, a cheap dropout mask, softmax
attention, and a stack of pre-LayerNorm Transformer blocks whose parameters carry a leading 'layers'
dimension and run under `jax.lax.scan`, so compile time does not grow with depth.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from shardbench.config import ModelConfig
from shardbench.errors import ConfigError
from shardbench.models.axes import (
    BATCH, EMBED, EXPERT, HEADS, KV, LAYERS, MLP, NORM, NORM_SEQ, SEQ, Axes, constrain, run_attention, run_stack,
    sequence_order,
)
from shardbench.models.moe import experts_mlp

# A mixture of experts' parameters, in place of the MLP's (mlp1/mlp2 kernels and biases) in each block.
MOE_NAMES = ("router_kernel", "expert1_kernel", "expert1_bias", "expert2_kernel", "expert2_bias")


def kernel_init(in_axis: int | tuple[int, ...], out_axis: int | tuple[int, ...],
                batch_axis: tuple[int, ...] = ()) -> jax.nn.initializers.Initializer:
    """Xavier-uniform over the named fan-in/fan-out dims; stacked-layer dims are independent draws."""
    return jax.nn.initializers.variance_scaling(
        1.0, "fan_avg", "uniform", in_axis=in_axis, out_axis=out_axis, batch_axis=batch_axis
    )


def param(value: jax.Array, axes: Axes, dtype: jnp.dtype) -> nnx.Param:
    """A parameter with its logical axis names (one per dimension) in its metadata."""
    assert value.ndim == len(axes), (value.shape, axes)
    return nnx.Param(value.astype(dtype), axes=axes)


LN_EPSILON = 1e-6


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    """LayerNorm computed in float32 whatever the compute dtype, cast back afterwards."""
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + LN_EPSILON) * scale.astype(jnp.float32) + bias.astype(jnp.float32)
    return y.astype(x.dtype)


# Largest depth that `unroll=0` (auto) unrolls completely; deeper stacks keep a rolled loop.
AUTO_UNROLL_MAX_LAYERS = 8


def layers_per_iteration(cfg: ModelConfig, depth: int | None = None) -> int:
    """How many of a stack's `depth` layers (default `cfg.num_layers`) one scan iteration runs:
    `cfg.unroll`, or for 0 (auto) every layer up to
    AUTO_UNROLL_MAX_LAYERS without --remat, else 1. Unrolled layers run faster (no loop-carried
    stacking of activations); a rolled loop keeps compile time flat as depth grows, and --remat needs
    it on CPU: XLA's CPU compiler drops the optimization barriers that keep a checkpointed block's
    recomputation apart, so without a loop boundary it merges the recomputation back into the forward
    pass and nothing is saved (measured: vit-tiny at batch 128 keeps 460 MiB of temporaries either way)."""
    depth = cfg.num_layers if depth is None else depth
    if cfg.unroll > 0:
        return max(1, min(cfg.unroll, depth))
    if cfg.remat != "none":
        return 1
    return max(1, depth) if depth <= AUTO_UNROLL_MAX_LAYERS else 1


def _mix32(x: jax.Array) -> jax.Array:
    """murmur3's 32-bit finaliser: a bijection on uint32 whose output bits each depend on every input bit."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def keep_mask(key: jax.Array, shape: tuple[int, ...], keep: float, order: np.ndarray | None = None) -> jax.Array:
    """Bernoulli(keep) booleans from a counter-based hash of each element's flat index.

    On two CPU cores, dropout on one 128x65x1536 array took 159 ms with threefry's Bernoulli mask and
    7.2 ms with this one (5.3 ms for the rescaling alone): hashing the index with a per-call seed drawn
    from `key` costs a few integer operations per element and fuses into the consumer. It is just as
    reproducible: the same key gives
    the same mask on any mesh, since the index is the element's global position. `order`: the true position of
    each row along dim 1, where a sequence is laid out in another order (context parallelism's head-tail
    chunks, `axes.sequence_order`), so that a token keeps its mask in any order.
    """
    seed = jax.random.bits(key, (2,), jnp.uint32)
    index = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for dim in reversed(range(len(shape))):
        place = jax.lax.broadcasted_iota(jnp.uint32, shape, dim)
        if dim == 1 and order is not None:
            place = jnp.broadcast_to(jnp.asarray(order, jnp.uint32).reshape(1, -1, *[1] * (len(shape) - 2)), shape)
        index = index + place * jnp.uint32(stride % 2**32)
        stride *= shape[dim]
    bits = _mix32(_mix32(index ^ seed[0]) + seed[1])
    threshold = min(int(round(keep * 2.0**32)), 2**32 - 1)
    return bits < jnp.uint32(threshold)


def dropout(x: jax.Array, rate: float, key: jax.Array | None, order: np.ndarray | None = None) -> jax.Array:
    """Inverted dropout with `keep_mask`'s mask (`order`: as there)."""
    if key is None or rate == 0.0:
        return x
    return jnp.where(keep_mask(key, x.shape, 1.0 - rate, order), x / (1.0 - rate), jnp.zeros_like(x))


def drop_rows(x: jax.Array, rate: jax.Array, seed: jax.Array) -> jax.Array:
    """Stochastic depth: each example's (leading row's) `x` zeroed with probability `rate` (a traced scalar),
    the rest scaled by 1 / (1 - rate). `seed`: two uint32 words. The mask hashes each row's index in `x` with
    them (see `keep_mask`): under jit
    that is the global batch, the same on any mesh; shard_map and pmap draw per device, as for dropout."""
    keep = 1.0 - rate
    rows = jax.lax.broadcasted_iota(jnp.uint32, (x.shape[0],) + (1,) * (x.ndim - 1), 0)
    bits = _mix32(_mix32(rows ^ seed[0]) + seed[1])
    # A uniform in [0, 1) from the hash's top 24 bits (all a float32 holds exactly: never rounds up to 1).
    kept = (bits >> 8).astype(jnp.float32) * (1.0 / 2.0**24) < keep
    return jnp.where(kept, x / jnp.maximum(keep, 1e-6).astype(x.dtype), jnp.zeros_like(x))


# What a block keeps for the backward pass under each --remat setting (None = no checkpointing).
REMAT = {
    "none": None,
    # Keep the matmul outputs, recompute LayerNorm, softmax, GELU and dropout: less memory, ~no extra FLOPs.
    "block": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    # Keep only each block's input and recompute the whole block: least memory, one more forward pass.
    "full": jax.checkpoint_policies.nothing_saveable,
}


# The attention kinds a block runs (`attention`): the resolved --model.attention, plus PADDED_XLA, which runs the
# cudnn kind's padding and sequence lengths through XLA's implementation so that a machine without cuDNN (the
# tests' CPU) checks that path's arithmetic against the einsum's.
EINSUM, FUSED, CUDNN, PADDED_XLA = "einsum", "fused", "cudnn", "padded-xla"
ATTENTION_KINDS = (EINSUM, FUSED, CUDNN, PADDED_XLA)


# What cuDNN's fused attention takes (jax._src.cudnn.fused_attention_stablehlo.check_is_flash_attention): a
# compute dtype of 16 bits and a head dim that is a multiple of 8, at most 256 (Hopper and later; 128 before).
CUDNN_DTYPES = ("bfloat16", "float16")
CUDNN_MAX_HEAD_DIM = 256


def cudnn_config_problem(cfg: ModelConfig, dtype: str) -> str | None:
    """Why the configuration alone shows cuDNN cannot run its fused attention, or None: a compute dtype that is
    not 16 bits, or a head dim cuDNN does not take. The devices are checked where the model is built
    (`shardbench.models.cudnn_device_problem`)."""
    if dtype not in CUDNN_DTYPES:
        return (f"--model.attention cudnn (an NVIDIA GPU's fused attention) needs a 16-bit compute dtype, not "
                f"--dtype {dtype}: on an NVIDIA GPU add --dtype bfloat16 (or float16); elsewhere use "
                f"--model.attention fused")
    if cfg.num_heads > 0 and cfg.embed_dim % cfg.num_heads == 0:  # an uneven split is the task's shape check
        head_dim = cfg.embed_dim // cfg.num_heads
        if head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
            return (f"--model.attention cudnn needs a head dim (embed dim / heads) that is a multiple "
                    f"of 8 and at most {CUDNN_MAX_HEAD_DIM}, not {cfg.embed_dim}/{cfg.num_heads} = "
                    f"{head_dim}: change --model.num-heads, or use --model.attention fused")
    return None


def check_heads(cfg: ModelConfig) -> None:
    """The width splits evenly into the heads: every attention block's rule, the ViT's and the LM's."""
    if cfg.embed_dim % cfg.num_heads:
        raise ConfigError(f"--model.embed-dim {cfg.embed_dim} is not divisible by --model.num-heads {cfg.num_heads}: "
                          f"give a width that is a multiple of the heads")


def check_cudnn_config(cfg: ModelConfig, dtype: str) -> None:
    """Refuse --model.attention cudnn in one line where the configuration alone shows cuDNN cannot run it
    (`cudnn_config_problem`)."""
    problem = cudnn_config_problem(cfg, dtype)
    if problem:
        raise ConfigError(problem)


def padded_length(length: int, multiple: int) -> int:
    """`length` rounded up to a multiple of `multiple` (65 -> 66 for 2, 72 for 8, 128 for 64)."""
    return -(-length // multiple) * multiple


def padded_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool, multiple: int,
                     implementation: str = "cudnn") -> jax.Array:
    """jax.nn.dot_product_attention with `implementation` on (batch, seq, heads, head_dim) q/k/v zero-padded
    at the end of the sequence to a multiple of `multiple`; the padding is masked by query and key/value sequence
    lengths and sliced off, so the output equals unpadded attention (causal too: padding at the end is never
    seen by a real position). A sequence already of such a length goes in as it is, with no mask.

    Why pad: cuDNN refuses to train on vit-seed's 65 tokens ("Unsupported sequence length Q 65, KV 65", jax
    0.11.2 on an H100), so jax.nn.dot_product_attention with no implementation never calls it. The only
    sequence-length rule in jax's own check (jax/_src/cudnn/fused_attention_stablehlo.py, check_is_flash_attention,
    the same in 0.10.2 and 0.11.0) asks training for even query and key lengths (with a bias). The default
    multiple, 8, meets it with a margin for the stricter check 0.11.2 applied, costs 7 rows at 65 tokens in the
    padding copies and nothing in the kernel (cuDNN works in tiles of 64 rows, so 65 and 72 both take two), and
    64 (a whole tile, 128 at 65 tokens) is the other setting the GPU suite measures beside it."""
    batch, length = q.shape[0], q.shape[1]
    padded = padded_length(length, multiple)
    if padded == length:
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=implementation)
    pad = ((0, 0), (0, padded - length), (0, 0), (0, 0))
    q, k, v = (jnp.pad(t, pad) for t in (q, k, v))
    lengths = jnp.full((batch,), length, jnp.int32)
    out = jax.nn.dot_product_attention(q, k, v, is_causal=causal, query_seq_lengths=lengths,
                                       key_value_seq_lengths=lengths, implementation=implementation)
    return out[:, :length]


def attention_weights(q: jax.Array, k: jax.Array, *, precision: jax.lax.Precision, causal: bool = False,
                      scale: jax.Array | None = None, mask_diagonal: bool = False) -> jax.Array:
    """The einsum attention's softmax weights, (batch, heads, query, key), from float32 scores q.k: divided by
    sqrt(head_dim), or multiplied by `scale` (one per head) where given. `causal` masks later keys; `mask_diagonal`
    masks each query's own key (weight exactly 0), as Locality Self-Attention does."""
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=precision, preferred_element_type=jnp.float32)
    if scale is None:
        scores = scores / math.sqrt(q.shape[-1])
    else:
        scores = scores * scale.astype(jnp.float32)[:, None, None]
    seq = q.shape[1]
    if causal:
        allowed = jnp.tril(jnp.ones((seq, seq), jnp.bool_))
        scores = jnp.where(allowed, scores, jnp.finfo(jnp.float32).min)
    if mask_diagonal:
        scores = jnp.where(jnp.eye(seq, dtype=jnp.bool_), jnp.finfo(jnp.float32).min, scores)
    return jax.nn.softmax(scores, axis=-1).astype(q.dtype)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, kind: str, precision: jax.lax.Precision,
              causal: bool = False, pad_multiple: int = 8, scale: jax.Array | None = None,
              mask_diagonal: bool = False) -> jax.Array:
    """Softmax attention over (batch, seq, heads, head_dim) q/k/v; `causal` lets position i see only
    positions <= i. `kind` (ATTENTION_KINDS): einsum = two einsums with float32 scores; fused =
    jax.nn.dot_product_attention with no implementation (XLA's composition: it never calls cuDNN); cudnn =
    cuDNN's fused kernel on a sequence padded to a multiple of `pad_multiple` (`padded_attention`); padded-xla =
    that padding run by XLA's implementation. `scale` (per head) and `mask_diagonal` are Locality
    Self-Attention's (`attention_weights`), einsum only."""
    if scale is not None or mask_diagonal:
        assert kind == EINSUM, f"locality self-attention runs on the einsum attention, not {kind}"
    if kind == FUSED:
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal)
    if kind in (CUDNN, PADDED_XLA):
        return padded_attention(q, k, v, causal=causal, multiple=pad_multiple,
                                implementation="cudnn" if kind == CUDNN else "xla")
    weights = attention_weights(q, k, precision=precision, causal=causal, scale=scale, mask_diagonal=mask_diagonal)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v, precision=precision)


def scan_layers(block: Callable[[jax.Array, Any], tuple[jax.Array, None]], x: jax.Array, layers: Any,
                *, remat: str, unroll: int) -> jax.Array:
    """Run `block` over the stacked `layers` (a pytree with a leading layer dim) with the --remat policy; a stack
    runner the parallel layer installed (pipeline stages) decides which slices of the stack run where."""
    if REMAT[remat] is not None:
        block = jax.checkpoint(block, policy=REMAT[remat])

    def run(h: jax.Array, stack: Any) -> jax.Array:
        return jax.lax.scan(block, h, stack, unroll=unroll)[0]

    return run_stack(run, x, layers)


class BlockStack(nnx.Module):
    """`num_layers` pre-LayerNorm Transformer blocks (self-attention, then a GELU MLP), each parameter
    stacked on a leading 'layers' dim. `causal` masks attention to earlier positions (a decoder).

    `cfg.lsa` (the vit's --model.lsa) makes the attention Locality Self-Attention (Lee, Lee and Song 2021, "Vision
    Transformer for Small-Size Datasets"), as their code (aanna0701/SPT_LSA_ViT, models/vit.py) defines it: each
    head's scores multiplied by a learned scale `lsa_scale` (layers, heads), initialised to 1/sqrt(head_dim), i.e. a
    learned temperature sqrt(head_dim) per head, and each token's score for itself masked. Their code learns one
    scale per head, as here (the paper writes one temperature); it is not weight-decayed here (no kernel), where
    their AdamW decays every parameter. Einsum attention only: `attention` must be 'einsum'."""

    def __init__(self, cfg: ModelConfig, *, param_dtype: jnp.dtype, attention: str, rngs: nnx.Rngs,
                 causal: bool = False) -> None:
        assert attention in ATTENTION_KINDS, attention
        n, e, h, m = cfg.num_layers, cfg.embed_dim, cfg.num_heads, cfg.mlp_dim
        d = e // h
        ones, zeros = jnp.ones, jnp.zeros
        self.ln1_scale = param(ones((n, e)), (LAYERS, NORM), param_dtype)
        self.ln1_bias = param(zeros((n, e)), (LAYERS, NORM), param_dtype)
        qkv = kernel_init(1, (3, 4), (0, 2))(rngs.params(), (n, e, 3, h, d))
        self.qkv_kernel = param(qkv, (LAYERS, EMBED, None, HEADS, KV), param_dtype)
        self.qkv_bias = param(zeros((n, 3, h, d)), (LAYERS, None, HEADS, KV), param_dtype)
        out = kernel_init((1, 2), 3, (0,))(rngs.params(), (n, h, d, e))
        self.out_kernel = param(out, (LAYERS, HEADS, KV, EMBED), param_dtype)
        self.out_bias = param(zeros((n, e)), (LAYERS, EMBED), param_dtype)
        self.ln2_scale = param(ones((n, e)), (LAYERS, NORM), param_dtype)
        self.ln2_bias = param(zeros((n, e)), (LAYERS, NORM), param_dtype)
        self.experts = cfg.num_experts
        if self.experts:  # a mixture of experts in place of the MLP (shardbench.models.moe)
            x = self.experts
            # Switch Transformer's init (Fedus et al. 2021, section 2.4), which it found stabler: truncated normal
            # of variance 0.1 / fan-in, a tenth of the usual, so the router's probabilities start near uniform.
            # Its choices need not be balanced: tokens that share most of their representation (lm-moe's position
            # table at init) share their top experts, and the capacity drops the excess until the loss balances.
            router = jax.nn.initializers.variance_scaling(0.1, "fan_in", "truncated_normal", in_axis=1, out_axis=2,
                                                          batch_axis=(0,))
            self.router_kernel = param(router(rngs.params(), (n, e, x)), (LAYERS, EMBED, None), param_dtype)
            self.expert1_kernel = param(kernel_init(2, 3, (0, 1))(rngs.params(), (n, x, e, m)),
                                        (LAYERS, EXPERT, EMBED, MLP), param_dtype)
            self.expert1_bias = param(zeros((n, x, m)), (LAYERS, EXPERT, MLP), param_dtype)
            self.expert2_kernel = param(kernel_init(2, 3, (0, 1))(rngs.params(), (n, x, m, e)),
                                        (LAYERS, EXPERT, MLP, EMBED), param_dtype)
            self.expert2_bias = param(zeros((n, x, e)), (LAYERS, EXPERT, EMBED), param_dtype)
            self.top_k, self.capacity_factor = cfg.top_k, cfg.capacity_factor
        else:
            self.mlp1_kernel = param(kernel_init(1, 2, (0,))(rngs.params(), (n, e, m)), (LAYERS, EMBED, MLP),
                                      param_dtype)
            self.mlp1_bias = param(zeros((n, m)), (LAYERS, MLP), param_dtype)
            self.mlp2_kernel = param(kernel_init(1, 2, (0,))(rngs.params(), (n, m, e)), (LAYERS, MLP, EMBED),
                                      param_dtype)
            self.mlp2_bias = param(zeros((n, e)), (LAYERS, EMBED), param_dtype)
        self.lsa = cfg.lsa
        if cfg.lsa:
            assert attention == EINSUM, f"--model.lsa runs on the einsum attention, not {attention}"
            self.lsa_scale = param(jnp.full((n, h), 1.0 / math.sqrt(d)), (LAYERS, HEADS), param_dtype)
        self.num_heads = h
        self.dropout_rate = cfg.dropout
        self.drop_path = cfg.drop_path
        self.unroll = layers_per_iteration(cfg)
        self.remat = cfg.remat
        self.attention = attention
        self.pad_multiple = cfg.attention_pad_multiple
        # auto is resolved by the model's builder (`models.qkv_layout_kind`); a ModelConfig with auto built into a
        # model directly runs fused, auto's choice off cuDNN's attention.
        self.qkv_layout = "fused" if cfg.qkv_layout == "auto" else cfg.qkv_layout
        self.causal = causal

    def __call__(self, x: jax.Array, *, rng: jax.Array | None, precision: jax.lax.Precision) -> Any:
        """The blocks' output; with experts, (output, (aux [B], dropped [B])): the load-balancing loss and the
        assignments dropped over capacity per sequence, summed over the blocks."""
        mlp_names = (MOE_NAMES if self.experts else ("mlp1_kernel", "mlp1_bias", "mlp2_kernel", "mlp2_bias"))
        names = ("ln1_scale", "ln1_bias", "qkv_kernel", "qkv_bias", "out_kernel", "out_bias",
                 "ln2_scale", "ln2_bias", *mlp_names)
        names += ("lsa_scale",) if self.lsa else ()
        stacked = {name: getattr(self, name)[...] for name in names}
        num_layers = stacked["ln1_scale"].shape[0]
        keys = None if rng is None else jax.random.split(rng, num_layers)
        dtype, rate, kind, causal = x.dtype, self.dropout_rate, self.attention, self.causal
        # A causal model lays its tokens out in the split's order (`axes.sequence_order`): each mask is drawn for
        # the token's true position.
        order = sequence_order(x.shape[1]) if self.causal else None
        pad_multiple, qkv_layout, lsa = self.pad_multiple, self.qkv_layout, self.lsa
        # Stochastic depth: rates rising linearly to drop_path at the last block (none without a key).
        depth = jnp.linspace(0.0, self.drop_path, num_layers) if num_layers > 1 else jnp.full((1,), self.drop_path)
        drop_path = self.drop_path > 0 and rng is not None

        experts = self.experts
        top_k, capacity_factor = (self.top_k, self.capacity_factor) if experts else (0, 0.0)

        def block(carry: Any, layer: tuple[dict[str, jax.Array], jax.Array | None, jax.Array]
                  ) -> tuple[Any, None]:
            # With experts the carry holds the per-sequence (aux, dropped) sums beside the activations.
            x, stats = carry if experts else (carry, None)
            p, key, path_rate = layer
            # LSA's scale stays in its stored dtype: it multiplies float32 scores (rounding it to bfloat16 would
            # move a learned temperature by up to 0.4%).
            p = {k: v if k == "lsa_scale" else v.astype(dtype) for k, v in p.items()}
            k1, k2 = (None, None) if key is None else jax.random.split(key)
            # One draw of four words per block for both branches' masks (a draw per branch compiled 2x slower).
            words = jax.random.bits(jax.random.fold_in(key, 1), (4,), jnp.uint32) if drop_path else None
            branch = (lambda h, salt: h) if not drop_path else (
                lambda h, salt: drop_rows(h, path_rate, words[2 * salt - 2:2 * salt]))
            # LayerNorm's output enters the matmuls whole along the sequence (SEQ), where the residual stream around
            # it may be split (NORM_SEQ: sequence parallelism gathers it here and reduce-scatters after).
            h = constrain(layer_norm(x, p["ln1_scale"], p["ln1_bias"]), (BATCH, SEQ, EMBED))
            q, k, v = (constrain(t, (BATCH, SEQ, HEADS, KV))
                       for t in project_qkv(h, p["qkv_kernel"], p["qkv_bias"], qkv_layout, precision))
            # A sequence split over devices (context parallelism) brings its own attention (models/axes.py).
            attn = run_attention(lambda q, k, v: attention(
                q, k, v, kind=kind, precision=precision, causal=causal, pad_multiple=pad_multiple,
                scale=p["lsa_scale"] if lsa else None, mask_diagonal=lsa), q, k, v, causal=causal,
                precision=precision)
            attn = constrain(attn, (BATCH, SEQ, HEADS, KV))  # (and so its gradient: heads split as q/k/v's are)
            attn = jnp.einsum("bqhd,hde->bqe", attn, p["out_kernel"], precision=precision) + p["out_bias"]
            x = constrain(x + branch(attn, 1), (BATCH, NORM_SEQ, EMBED))
            h = constrain(layer_norm(x, p["ln2_scale"], p["ln2_bias"]), (BATCH, SEQ, EMBED))
            if experts:
                h, aux, dropped = experts_mlp(h, p, top_k=top_k, capacity_factor=capacity_factor,
                                              precision=precision)
                stats = (stats[0] + aux, stats[1] + dropped)
            else:
                h = jnp.einsum("bse,em->bsm", h, p["mlp1_kernel"], precision=precision) + p["mlp1_bias"]
                h = constrain(dropout(jax.nn.gelu(h), rate, k1, order), (BATCH, SEQ, MLP))
                h = jnp.einsum("bsm,me->bse", h, p["mlp2_kernel"], precision=precision) + p["mlp2_bias"]
            x = constrain(x + branch(dropout(h, rate, k2, order), 2), (BATCH, NORM_SEQ, EMBED))
            return ((x, stats) if experts else x), None

        if experts:  # the router's probabilities and the load-balancing loss stay float32
            zero = jnp.zeros(x.shape[:1], jnp.float32)
            return scan_layers(block, (x, (zero, zero)), (stacked, keys, depth), remat=self.remat,
                               unroll=self.unroll)
        return scan_layers(block, x, (stacked, keys, depth), remat=self.remat, unroll=self.unroll)


def project_qkv(h: jax.Array, kernel: jax.Array, bias: jax.Array, layout: str,
                precision: jax.lax.Precision) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q, k and v, each (batch, seq, heads, head_dim), from (batch, seq, embed) `h` and the stacked (embed, 3,
    heads, head_dim) `kernel` and (3, heads, head_dim) `bias`, by --model.qkv-layout. The same parameter and the
    same sums in every layout; what differs is the layout XLA's backward has to produce.
    fused: one einsum to (3, batch, seq, heads, head_dim), whose backward transposes a [3, heads, head_dim, batch,
    seq] array (the largest single kernel of vit-seed's bfloat16 step on an H100). split: three einsums on slices
    of the kernel. seq-major: one einsum to (batch, seq, 3, heads, head_dim), split on its third axis."""
    if layout == "split":
        return tuple(jnp.einsum("bse,ehd->bshd", h, kernel[:, i], precision=precision) + bias[i]
                     for i in range(3))  # type: ignore[return-value]
    if layout == "seq-major":
        qkv = jnp.einsum("bse,ethd->bsthd", h, kernel, precision=precision) + bias
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    qkv = jnp.einsum("bse,ethd->tbshd", h, kernel, precision=precision) + bias[:, None, None]
    return qkv[0], qkv[1], qkv[2]




def block_flops(tokens: int, embed: int, mlp: int, layers: int) -> int:
    """Forward matmul FLOPs of `layers` blocks on one sequence of `tokens`: q/k/v and output projections
    8*T*E^2, attention scores and weighted sum 4*T^2*E (counted in full even when causal), MLP 4*T*E*M."""
    return layers * (8 * tokens * embed * embed + 4 * tokens * tokens * embed + 4 * tokens * embed * mlp)


def count_params(model: nnx.Module) -> int:
    """Number of parameter elements (works on abstract models from nnx.eval_shape too)."""
    state = nnx.state(model, nnx.Param)
    return sum(math.prod(x.shape) for x in jax.tree.leaves(state))
