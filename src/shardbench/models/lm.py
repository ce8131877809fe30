"""A decoder-only Transformer language model in flax nnx, as the seed's data-parallel notebook trains it:
token embedding plus a trainable position table initialised to sinusoids, pre-LayerNorm blocks with causal
self-attention and a GELU MLP (`BlockStack`), a final LayerNorm and an untied output head.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from shardbench.config import ModelConfig
from shardbench.models.axes import (
    BATCH, EMBED, EXPERT, HEADS, MLP, NORM, NORM_SEQ, SEQ, VOCAB, constrain, sequence_order,
)
from shardbench.models.moe import MoEOutputs, expert_flops
from shardbench.models.transformer import BlockStack, block_flops, kernel_init, layer_norm, param

AXIS_FIELDS: dict[str, str] = {
    EMBED: "model.embed_dim", MLP: "model.mlp_dim", HEADS: "model.num_heads", VOCAB: "model.vocab_size",
    EXPERT: "model.num_experts",
}


def sinusoids(length: int, width: int) -> np.ndarray:
    """(length, width) sine/cosine position codes: even columns sin(p * w_i), odd columns cos(p * w_i)."""
    positions = np.arange(length)[:, None]
    freqs = np.exp(-np.log(10000.0) * np.arange(0, width, 2) / width)[None, :]
    table = np.zeros((length, width), np.float32)
    table[:, 0::2] = np.sin(positions * freqs)
    table[:, 1::2] = np.cos(positions * freqs)[:, : width // 2]
    return table


class TransformerLM(nnx.Module):
    """tokens (batch, seq) int -> next-token logits (batch, seq, vocab) in float32; with experts
    (`cfg.num_experts`), `MoEOutputs` (the logits, and per sequence the load-balancing loss and the dropped
    assignments). `attention`: the resolved attention kind (`transformer.ATTENTION_KINDS`)."""

    def __init__(self, cfg: ModelConfig, *, dtype: jnp.dtype = jnp.float32, param_dtype: jnp.dtype = jnp.float32,
                 precision: jax.lax.Precision = jax.lax.Precision.DEFAULT, attention: str = "einsum",
                 rngs: nnx.Rngs) -> None:
        e, v = cfg.embed_dim, cfg.vocab_size
        embed = 0.02 * jax.random.normal(rngs.params(), (v, e))
        self.token_embed = param(embed, (VOCAB, EMBED), param_dtype)
        self.pos_embed = param(jnp.asarray(sinusoids(cfg.seq_len, e)), (SEQ, EMBED), param_dtype)
        self.blocks = BlockStack(cfg, param_dtype=param_dtype, attention=attention, rngs=rngs, causal=True)
        self.norm_scale = param(jnp.ones((e,)), (NORM,), param_dtype)
        self.norm_bias = param(jnp.zeros((e,)), (NORM,), param_dtype)
        self.head_kernel = param(kernel_init(0, 1)(rngs.params(), (e, v)), (EMBED, VOCAB), param_dtype)
        self.dtype = dtype
        self.precision = precision

    def __call__(self, tokens: jax.Array, *, rng: jax.Array | None = None) -> jax.Array:
        dtype, precision = self.dtype, self.precision
        seq = tokens.shape[1]
        positions = self.pos_embed[...][:seq]
        # A sequence split over devices may be laid out in another order (context parallelism's head-tail chunks):
        # the tokens are taken in that order with their true positions, and the blocks' output put back in token
        # order before the head. The tokens are whole on every device, so the first costs nothing; the second is
        # one exchange of the (batch, seq, embed) activations, smaller than the logits.
        order = sequence_order(seq)
        if order is not None:
            tokens, positions = tokens[:, order], positions[order]
        x = jnp.take(self.token_embed[...].astype(dtype), tokens, axis=0)
        x = constrain(x + positions.astype(dtype), (BATCH, NORM_SEQ, EMBED))
        x = self.blocks(x, rng=rng, precision=precision)
        x, stats = x if self.blocks.experts else (x, None)
        if order is not None:
            x = constrain(x[:, np.argsort(order)], (BATCH, NORM_SEQ, EMBED))
        x = layer_norm(x, self.norm_scale[...], self.norm_bias[...])
        logits = jnp.einsum("bse,ev->bsv", x, self.head_kernel[...].astype(dtype), precision=precision)
        if stats is not None:  # a mixture of experts: its loss and drops go to the task with the logits
            return MoEOutputs(logits.astype(jnp.float32), *stats)
        return logits.astype(jnp.float32)


def flops_per_example(cfg: ModelConfig) -> dict[str, int]:
    """Matmul FLOPs of one sequence of T = seq_len tokens: the blocks plus the output head 2*T*E*V
    (the embedding is a lookup). Train = 3 x forward. With X experts, each block's MLP 4*T*E*M becomes the k
    active experts' 4*T*k*E*M plus the router's 2*T*E*X (dispatch and combine are not counted)."""
    t, e = cfg.seq_len, cfg.embed_dim
    forward = block_flops(t, e, cfg.mlp_dim, cfg.num_layers) + 2 * t * e * cfg.vocab_size
    if cfg.num_experts:
        dense, active = 4 * t * e * cfg.mlp_dim, expert_flops(t, e, cfg.mlp_dim, cfg.top_k)
        forward += cfg.num_layers * (active - dense + 2 * t * e * cfg.num_experts)
    return {"forward": forward, "train": 3 * forward}
