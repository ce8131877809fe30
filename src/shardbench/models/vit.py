"""The seeds' Vision Transformer, written afresh in flax nnx with logical axis names on every parameter.

Its blocks are `shardbench.models.transformer.BlockStack` (stacked layers under a scan). The parameter count equals the seed notebook's model summary
(10,695,562 for the `vit-seed` shapes): patch embedding as a 4x4 conv kernel, class token, learned
position embedding, per block two LayerNorms, q/k/v and output projections with biases, a two-layer
GELU MLP, and a final LayerNorm and classifier head.

`--model.pool mean` makes a different model, as big_vision's ViT does with pool_type 'gap': no class token (so
N tokens, not N + 1, and a position table of N rows), the final LayerNorm applied to every token, their mean
fed to the head.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from shardbench.config import ModelConfig
from shardbench.models.axes import BATCH, CLASSES, EMBED, HEADS, MLP, NORM, PATCH, SEQ, constrain
from shardbench.models.transformer import BlockStack, block_flops, kernel_init, layer_norm, param

# Which configuration field each logical axis comes from: used to explain a layout that cannot divide.
AXIS_FIELDS: dict[str, str] = {
    EMBED: "model.embed_dim", MLP: "model.mlp_dim", HEADS: "model.num_heads", CLASSES: "model.num_classes",
}


class VisionTransformer(nnx.Module):
    """Patch embedding + class token + learned positions -> encoder stack -> LayerNorm -> linear head.

    pool='cls' (the seed's model): the head reads the class token after the final LayerNorm. pool='mean': no
    class token; the final LayerNorm normalises every token, then the head reads their mean (big_vision's 'gap').
    `attention`: the resolved attention kind (`transformer.ATTENTION_KINDS`)."""

    def __init__(self, cfg: ModelConfig, *, image_size: int, dtype: jnp.dtype = jnp.float32,
                 param_dtype: jnp.dtype = jnp.float32,
                 precision: jax.lax.Precision = jax.lax.Precision.DEFAULT, attention: str = "einsum",
                 rngs: nnx.Rngs) -> None:
        p, e = cfg.patch_size, cfg.embed_dim
        tokens = num_tokens(cfg, image_size)
        patch = kernel_init((0, 1, 2), 3)(rngs.params(), (p, p, 3, e))
        self.patch_kernel = param(patch, (None, None, PATCH, EMBED), param_dtype)
        self.patch_bias = param(jnp.zeros((e,)), (EMBED,), param_dtype)
        self.pool = cfg.pool
        if cfg.pool == "cls":
            self.cls_token = param(jnp.zeros((1, 1, e)), (None, None, EMBED), param_dtype)
        pos = 0.02 * jax.random.truncated_normal(rngs.params(), -2.0, 2.0, (1, tokens, e))
        self.pos_embed = param(pos, (None, SEQ, EMBED), param_dtype)
        self.encoder = BlockStack(cfg, param_dtype=param_dtype, attention=attention, rngs=rngs)
        self.norm_scale = param(jnp.ones((e,)), (NORM,), param_dtype)
        self.norm_bias = param(jnp.zeros((e,)), (NORM,), param_dtype)
        head = kernel_init(0, 1)(rngs.params(), (e, cfg.num_classes))
        self.head_kernel = param(head, (EMBED, CLASSES), param_dtype)
        self.head_bias = param(jnp.zeros((cfg.num_classes,)), (CLASSES,), param_dtype)
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
        if self.pool == "cls":
            cls = jnp.broadcast_to(self.cls_token[...].astype(dtype), (b, 1, x.shape[-1]))
            x = jnp.concatenate([cls, x], axis=1)
        x = x + self.pos_embed[...].astype(dtype)
        x = constrain(x, (BATCH, SEQ, EMBED))
        x = self.encoder(x, rng=rng, precision=precision)
        if self.pool == "cls":
            x = layer_norm(x[:, 0], self.norm_scale[...], self.norm_bias[...])
        else:  # the mean in float32 whatever the compute dtype, as LayerNorm's statistics are
            x = layer_norm(x, self.norm_scale[...], self.norm_bias[...])
            x = x.astype(jnp.float32).mean(axis=1).astype(dtype)
        logits = jnp.einsum("be,ec->bc", x, self.head_kernel[...].astype(dtype), precision=precision)
        return (logits + self.head_bias[...].astype(dtype)).astype(jnp.float32)


def num_tokens(cfg: ModelConfig, image_size: int) -> int:
    """Tokens the encoder sees: the (image_size / patch)^2 patches, plus the class token for pool='cls'."""
    return (image_size // cfg.patch_size) ** 2 + (1 if cfg.pool == "cls" else 0)


def flops_per_example(cfg: ModelConfig, image_size: int) -> dict[str, int]:
    """Matmul FLOPs (2 per multiply-add) of one image, forward and train (backward = 2 x forward).

    With N = (image_size / patch)^2 patches, T = N + 1 tokens (N for pool='mean': no class token), E = embed,
    M = mlp, L = layers, C = classes:
    forward = 2*N*(3*patch^2)*E + L*(8*T*E^2 + 4*T^2*E + 4*T*E*M) + 2*E*C
    (q/k/v and output projections 8*T*E^2, scores and weighted sum 4*T^2*E, MLP 4*T*E*M).
    Element-wise work (LayerNorm, softmax, GELU, the optimizer) is left out, as MFU conventions do.
    """
    p, e, m, n_layers = cfg.patch_size, cfg.embed_dim, cfg.mlp_dim, cfg.num_layers
    patches = (image_size // p) ** 2
    tokens = num_tokens(cfg, image_size)
    forward = 2 * patches * 3 * p * p * e + block_flops(tokens, e, m, n_layers) + 2 * e * cfg.num_classes
    return {"forward": forward, "train": 3 * forward}
