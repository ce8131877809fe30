"""The seeds' Vision Transformer, written afresh in flax nnx with logical axis names on every parameter.

Its blocks are `shardbench.models.transformer.BlockStack` (stacked layers under a scan). The parameter count equals the seed notebook's model summary
(10,695,562 for the `vit-seed` shapes): patch embedding as a 4x4 conv kernel, class token, learned
position embedding, per block two LayerNorms, q/k/v and output projections with biases, a two-layer
GELU MLP, and a final LayerNorm and classifier head.

`--model.pool mean` makes a different model, as big_vision's ViT does with pool_type 'gap': no class token (so
N tokens, not N + 1, and a position table of N rows), the final LayerNorm applied to every token, their mean
fed to the head.

The options of published small-dataset ViTs, each a different model (the defaults are the seed's, unchanged):
- `--model.stem conv`: Compact Convolutional Transformer's tokenizer (Hassani et al. 2021, "Escaping the Big Data
  Paradigm with Compact Transformers"; SHI-Labs/Compact-Transformers src/utils/tokenizer.py), `conv_tokens`.
- `--model.stem shifted-patch`: Shifted Patch Tokenization (Lee, Lee and Song 2021, "Vision Transformer for
  Small-Size Datasets"; aanna0701/SPT_LSA_ViT models/SPT.py), `shifted_images`, then `patches`.
- `--model.pool sequence`: CCT's sequence pooling (src/utils/transformers.py, TransformerClassifier),
  `sequence_pool`.
- `--model.lsa`: SPT/LSA's Locality Self-Attention, in the blocks (`transformer.BlockStack`).
Only the tokenizer, pooling and attention are theirs: the encoder stays this ViT's pre-LayerNorm blocks (with q/k/v
biases), initialised as here, and LayerNorm's epsilon is 1e-6 throughout (PyTorch's is 1e-5). CCT's own block also
differs (no q/k/v bias, a LayerNorm on the residual stream after attention, attention dropout 0.1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from shardbench.config import ModelConfig
from shardbench.errors import ConfigError
from shardbench.models.axes import BATCH, CLASSES, EMBED, HEADS, MLP, NORM, NORM_SEQ, PATCH, SEQ, constrain
from shardbench.models.transformer import EINSUM, BlockStack, block_flops, kernel_init, layer_norm, param

# The conv stem (CCT's Tokenizer, kernel_size=3 as in CCT-x/3xN): 3x3 convolutions of stride 1, padding 1, no bias;
# ReLU; 3x3 max-pools of stride 2, padding 1. The layers before the last have CONV_CHANNELS outputs (CCT's
# `in_planes`, which its models leave at the default 64); the last has embed_dim.
CONV_KERNEL, POOL_WINDOW, POOL_STRIDE, CONV_CHANNELS = 3, 3, 2, 64
# Shifted Patch Tokenization: the image and its four diagonal shifts, stacked on channels.
SPT_COPIES = 5

# Which configuration field each logical axis comes from: used to explain a layout that cannot divide.
AXIS_FIELDS: dict[str, str] = {
    EMBED: "model.embed_dim", MLP: "model.mlp_dim", HEADS: "model.num_heads", CLASSES: "model.num_classes",
}


def check_options(cfg: ModelConfig) -> None:
    """The vit's own rules for its classes, tokenizer and attention options, one line each: it tells at least two
    classes apart, Locality Self-Attention runs on the einsum attention only (it changes the softmax), and shifted
    patches need a patch with a half."""
    if cfg.num_classes < 2:
        raise ConfigError(f"--model.num-classes {cfg.num_classes}: the vit classifies, which needs at least 2 classes "
                          f"(with one, every prediction is right and the loss is 0 from the first step)")
    if cfg.lsa and cfg.attention in ("fused", "cudnn"):
        raise ConfigError(f"--model.lsa (a learned scale and a masked diagonal in the softmax) runs on the einsum "
                          f"attention only, not --model.attention {cfg.attention}: use --model.attention einsum (or "
                          f"auto, which takes einsum with --model.lsa)")
    if cfg.stem == "shifted-patch" and cfg.patch_size < 2:
        raise ConfigError(f"--model.stem shifted-patch shifts the image by half a patch: --model.patch-size "
                          f"{cfg.patch_size} has no half; give it 2 or more (e.g. 4)")


def conv_channels(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(input, output) channels of each conv stem layer: 3 -> 64 -> ... -> 64 -> embed_dim (CCT's n_filter_list)."""
    widths = [3] + [CONV_CHANNELS] * (cfg.stem_layers - 1) + [cfg.embed_dim]
    return list(zip(widths[:-1], widths[1:]))


def pooled_side(side: int) -> int:
    """The side after a 3x3 max-pool of stride 2 and padding 1 (a stride-1 'same' conv keeps it): ceil(side / 2)."""
    return (side + 2 - POOL_WINDOW) // POOL_STRIDE + 1


def conv_tokens(images: jax.Array, kernels: list[jax.Array], precision: jax.lax.Precision) -> jax.Array:
    """CCT's tokenizer on (batch, H, W, C) images with (3, 3, in, out) kernels: per layer a 3x3 convolution
    (stride 1, padding 1, no bias), ReLU and a 3x3 max-pool (stride 2, padding 1, padded with -inf as PyTorch's
    MaxPool2d). Returns (batch, tokens, out) with the tokens in row-major order (CCT's flatten of H, W)."""
    x = images
    for kernel in kernels:
        x = jax.lax.conv_general_dilated(x, kernel.astype(x.dtype), window_strides=(1, 1), padding=((1, 1), (1, 1)),
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=precision)
        x = jax.nn.relu(x)
        pad = POOL_WINDOW // 2
        # A concrete (numpy) -inf makes this lax's max-pool primitive, which has a gradient; a traced one would not.
        x = jax.lax.reduce_window(x, np.array(-np.inf, x.dtype), jax.lax.max, (1, POOL_WINDOW, POOL_WINDOW, 1),
                                  (1, POOL_STRIDE, POOL_STRIDE, 1), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    b, h, w, c = x.shape
    return x.reshape(b, h * w, c)


def shifted_images(images: jax.Array, shift: int) -> jax.Array:
    """SPT's PatchShifting with its four diagonal directions: (batch, H, W, C) -> (batch, H, W, 5C), the image then
    its copies moved by `shift` pixels down-right, down-left, up-right and up-left (zero-filled where the copy
    moved in), in their code's order x, x_lu, x_ru, x_lb, x_rb: x_lu[i, j] = x[i - s, j - s], x_ru[i, j] =
    x[i - s, j + s], x_lb[i, j] = x[i + s, j - s], x_rb[i, j] = x[i + s, j + s]. The images come normalised, so the
    zeros are the dataset's mean, as theirs (they shift after Normalize)."""
    _, h, w, _ = images.shape
    s = shift
    pad = jnp.pad(images, ((0, 0), (s, s), (s, s), (0, 0)))
    copies = [pad[:, rows:rows + h, cols:cols + w] for rows, cols in ((0, 0), (0, 2 * s), (2 * s, 0), (2 * s, 2 * s))]
    return jnp.concatenate([images] + copies, axis=-1)


def patches(images: jax.Array, p: int) -> jax.Array:
    """(batch, H, W, C) -> (batch, (H/p)(W/p), p*p*C): row-major patches, each flattened as (row, column, channel)."""
    b, height, width, c = images.shape
    x = images.reshape(b, height // p, p, width // p, p, c)
    return x.transpose(0, 1, 3, 2, 4, 5).reshape(b, (height // p) * (width // p), p * p * c)


def sequence_pool(x: jax.Array, kernel: jax.Array, bias: jax.Array,
                  precision: jax.lax.Precision) -> tuple[jax.Array, jax.Array]:
    """CCT's sequence pooling of (batch, tokens, embed) `x` (already LayerNormed): a score per token from the
    (embed, 1) `kernel` and (1,) `bias`, a softmax over the tokens, and the tokens' weighted sum, all in float32 (as
    the mean pool's mean). Returns (pooled (batch, embed) in x's dtype, weights (batch, tokens))."""
    x32 = x.astype(jnp.float32)
    scores = jnp.einsum("bte,eo->bto", x32, kernel.astype(jnp.float32), precision=precision)[..., 0]
    weights = jax.nn.softmax(scores + bias.astype(jnp.float32)[0], axis=-1)
    pooled = jnp.einsum("bt,bte->be", weights, x32, precision=precision)
    return pooled.astype(x.dtype), weights


class VisionTransformer(nnx.Module):
    """Patch embedding + class token + learned positions -> encoder stack -> LayerNorm -> linear head.

    pool='cls' (the seed's model): the head reads the class token after the final LayerNorm. pool='mean': no
    class token; the final LayerNorm normalises every token, then the head reads their mean (big_vision's 'gap').
    pool='sequence': no class token; the final LayerNorm normalises every token, then the head reads their
    weighted sum (`sequence_pool`, CCT's).
    stem='patch' (the seed's): a linear projection of each patch. stem='conv': CCT's tokenizer (`conv_tokens`),
    (image/2^stem_layers)^2 tokens of width embed_dim; its kernels are He-normal initialised (PyTorch's
    kaiming_normal_, as CCT's). stem='shifted-patch': SPT (`shifted_images`, then patches of 15*p^2 values, each
    LayerNormed, then a linear projection, Xavier-normal initialised as theirs).
    `attention`: the resolved attention kind (`transformer.ATTENTION_KINDS`); with cfg.lsa the blocks run the
    einsum attention whatever it is (`check_options` refuses an explicit fused or cudnn with --model.lsa, so only
    'auto' on a GPU, which resolves to fused, is turned to einsum here)."""

    def __init__(self, cfg: ModelConfig, *, image_size: int, dtype: jnp.dtype = jnp.float32,
                 param_dtype: jnp.dtype = jnp.float32,
                 precision: jax.lax.Precision = jax.lax.Precision.DEFAULT, attention: str = "einsum",
                 rngs: nnx.Rngs) -> None:
        p, e = cfg.patch_size, cfg.embed_dim
        tokens = num_tokens(cfg, image_size)
        self.stem = cfg.stem
        if cfg.stem == "conv":
            self.conv_layers = len(conv_channels(cfg))
            he_normal = jax.nn.initializers.variance_scaling(2.0, "fan_in", "normal", in_axis=(0, 1, 2),
                                                             out_axis=3)
            for i, (c_in, c_out) in enumerate(conv_channels(cfg)):
                kernel = he_normal(rngs.params(), (CONV_KERNEL, CONV_KERNEL, c_in, c_out))
                # Pixels in, the model's width out (the layers before the last: 64 channels, no name of their own).
                axes = (None, None, PATCH if i == 0 else None, EMBED if i == self.conv_layers - 1 else None)
                setattr(self, f"conv{i}_kernel", param(kernel, axes, param_dtype))
        else:
            channels = 3 * (SPT_COPIES if cfg.stem == "shifted-patch" else 1)
            if cfg.stem == "shifted-patch":
                self.spt_norm_scale = param(jnp.ones((p * p * channels,)), (NORM,), param_dtype)
                self.spt_norm_bias = param(jnp.zeros((p * p * channels,)), (NORM,), param_dtype)
                init = jax.nn.initializers.variance_scaling(1.0, "fan_avg", "normal", in_axis=(0, 1, 2),
                                                            out_axis=3)
            else:
                init = kernel_init((0, 1, 2), 3)
            patch = init(rngs.params(), (p, p, channels, e))
            self.patch_kernel = param(patch, (None, None, PATCH, EMBED), param_dtype)
            self.patch_bias = param(jnp.zeros((e,)), (EMBED,), param_dtype)
        self.pool = cfg.pool
        if cfg.pool == "cls":
            self.cls_token = param(jnp.zeros((1, 1, e)), (None, None, EMBED), param_dtype)
        pos = 0.02 * jax.random.truncated_normal(rngs.params(), -2.0, 2.0, (1, tokens, e))
        self.pos_embed = param(pos, (None, SEQ, EMBED), param_dtype)
        self.encoder = BlockStack(cfg, param_dtype=param_dtype, attention=EINSUM if cfg.lsa else attention,
                                  rngs=rngs)
        self.norm_scale = param(jnp.ones((e,)), (NORM,), param_dtype)
        self.norm_bias = param(jnp.zeros((e,)), (NORM,), param_dtype)
        head = kernel_init(0, 1)(rngs.params(), (e, cfg.num_classes))
        self.head_kernel = param(head, (EMBED, CLASSES), param_dtype)
        self.head_bias = param(jnp.zeros((cfg.num_classes,)), (CLASSES,), param_dtype)
        if cfg.pool == "sequence":  # CCT's attention_pool: Linear(embed, 1), truncated normal 0.02 and zero bias
            score = 0.02 * jax.random.truncated_normal(rngs.params(), -2.0, 2.0, (e, 1))
            self.seq_pool_kernel = param(score, (EMBED, None), param_dtype)
            self.seq_pool_bias = param(jnp.zeros((1,)), (None,), param_dtype)
        self.patch_size = p
        self.dtype = dtype
        self.precision = precision

    def stem_tokens(self, images: jax.Array) -> jax.Array:
        """The stem's tokens (batch, tokens, embed) of (batch, H, W, 3) images, before class token and positions."""
        dtype, precision, p = self.dtype, self.precision, self.patch_size
        if self.stem == "conv":
            kernels = [getattr(self, f"conv{i}_kernel")[...] for i in range(self.conv_layers)]
            x = conv_tokens(images.astype(dtype), kernels, precision)
        else:
            # Patchify with a reshape: the same arithmetic as a stride-p 'VALID' conv, and one plain matmul.
            x = images.astype(dtype)
            if self.stem == "shifted-patch":
                x = shifted_images(x, p // 2)
            x = patches(x, p)
            if self.stem == "shifted-patch":
                x = layer_norm(x, self.spt_norm_scale[...], self.spt_norm_bias[...])
            kernel = self.patch_kernel[...].astype(dtype).reshape(x.shape[-1], -1)
            x = jnp.einsum("bnp,pe->bne", x, kernel, precision=precision) + self.patch_bias[...].astype(dtype)
        return x

    def __call__(self, images: jax.Array, *, rng: jax.Array | None = None) -> jax.Array:
        """images: (batch, H, W, 3), already normalised. rng=None means no dropout. Returns float32 logits."""
        dtype, precision = self.dtype, self.precision
        b = images.shape[0]
        x = self.stem_tokens(images)
        if self.pool == "cls":
            cls = jnp.broadcast_to(self.cls_token[...].astype(dtype), (b, 1, x.shape[-1]))
            x = jnp.concatenate([cls, x], axis=1)
        x = x + self.pos_embed[...].astype(dtype)
        x = constrain(x, (BATCH, NORM_SEQ, EMBED))
        x = self.encoder(x, rng=rng, precision=precision)
        if self.pool == "cls":
            x = layer_norm(x[:, 0], self.norm_scale[...], self.norm_bias[...])
        elif self.pool == "sequence":
            x = layer_norm(x, self.norm_scale[...], self.norm_bias[...])
            x, _ = sequence_pool(x, self.seq_pool_kernel[...], self.seq_pool_bias[...], precision)
        else:  # the mean in float32 whatever the compute dtype, as LayerNorm's statistics are
            x = layer_norm(x, self.norm_scale[...], self.norm_bias[...])
            x = x.astype(jnp.float32).mean(axis=1).astype(dtype)
        logits = jnp.einsum("be,ec->bc", x, self.head_kernel[...].astype(dtype), precision=precision)
        return (logits + self.head_bias[...].astype(dtype)).astype(jnp.float32)


def num_patches(cfg: ModelConfig, image_size: int) -> int:
    """Tokens the stem makes: (image_size / patch)^2 for the patch stems; for the conv stem (image side halved,
    rounded up, by each layer's max-pool)^2."""
    if cfg.stem == "conv":
        side = image_size
        for _ in range(cfg.stem_layers):
            side = pooled_side(side)
        return side * side
    return (image_size // cfg.patch_size) ** 2


def num_tokens(cfg: ModelConfig, image_size: int) -> int:
    """Tokens the encoder sees: the stem's tokens (`num_patches`), plus the class token for pool='cls'."""
    return num_patches(cfg, image_size) + (1 if cfg.pool == "cls" else 0)


def stem_flops(cfg: ModelConfig, image_size: int) -> int:
    """Forward matmul FLOPs of the stem on one image: 2*N*(3*p^2)*E for patches, 2*N*(15*p^2)*E for shifted
    patches (the LayerNorm is element-wise), and for the conv stem each layer's 2*side^2*9*C_in*C_out at the side it
    convolves (the max-pool and ReLU are element-wise)."""
    if cfg.stem == "conv":
        total, side = 0, image_size
        for c_in, c_out in conv_channels(cfg):
            total += 2 * side * side * CONV_KERNEL * CONV_KERNEL * c_in * c_out
            side = pooled_side(side)
        return total
    channels = 3 * (SPT_COPIES if cfg.stem == "shifted-patch" else 1)
    return 2 * num_patches(cfg, image_size) * channels * cfg.patch_size ** 2 * cfg.embed_dim


def flops_per_example(cfg: ModelConfig, image_size: int) -> dict[str, int]:
    """Matmul FLOPs (2 per multiply-add) of one image, forward and train (backward = 2 x forward).

    With N = (image_size / patch)^2 patches, T = N + 1 tokens (N for pool='mean' or 'sequence': no class token),
    E = embed, M = mlp, L = layers, C = classes:
    forward = 2*N*(3*patch^2)*E + L*(8*T*E^2 + 4*T^2*E + 4*T*E*M) + 2*E*C
    (q/k/v and output projections 8*T*E^2, scores and weighted sum 4*T^2*E, MLP 4*T*E*M).
    The stem's term is `stem_flops` (shifted patches: 15 channels for 3; conv: N = (image/2^layers)^2 tokens and
    2*side^2*9*C_in*C_out per layer). pool='sequence' adds 4*T*E: its linear layer's scores (2*T*E) and the
    weighted sum (2*T*E, a matmul as attention's is). LSA adds only element-wise work.
    Element-wise work (LayerNorm, softmax, GELU, the optimizer) is left out, as MFU conventions do.
    """
    e, m, n_layers = cfg.embed_dim, cfg.mlp_dim, cfg.num_layers
    tokens = num_tokens(cfg, image_size)
    pool = 4 * tokens * e if cfg.pool == "sequence" else 0
    forward = stem_flops(cfg, image_size) + block_flops(tokens, e, m, n_layers) + pool + 2 * e * cfg.num_classes
    return {"forward": forward, "train": 3 * forward}
