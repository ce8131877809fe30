"""A small decoder-only Transformer language model, written the way flax's own nnx examples write models.

Train it on next-token prediction under dp, fsdp, tp, zero1/zero2 or a 2-D mix of them with:

    shardbench train --model examples/transformer.py:build --task next-token --data tokens-uniform \
        --model.vocab-size 256 --model.seq-len 64 --devices 8 --strategy fsdp

Every parameter names its dimensions with flax's sharding metadata in the conventional vocabulary of
flax's lm1b example and MaxText: 'vocab', 'embed', 'heads', 'kv', 'mlp'.
"""

import jax.numpy as jnp
from flax import nnx

kernel_init = nnx.initializers.xavier_uniform()
embed_init = nnx.initializers.normal(stddev=0.02)


def partitioned(init, names):
  return nnx.with_partitioning(init, names)


class MlpBlock(nnx.Module):
  def __init__(self, embed: int, hidden: int, *, dtype, rngs: nnx.Rngs):
    self.up = nnx.Linear(embed, hidden, kernel_init=partitioned(kernel_init, ('embed', 'mlp')),
                         bias_init=partitioned(nnx.initializers.zeros_init(), ('mlp',)), dtype=dtype, rngs=rngs)
    self.down = nnx.Linear(hidden, embed, kernel_init=partitioned(kernel_init, ('mlp', 'embed')),
                           bias_init=partitioned(nnx.initializers.zeros_init(), ('embed',)), dtype=dtype,
                           rngs=rngs)

  def __call__(self, x):
    return self.down(nnx.gelu(self.up(x)))


class DecoderBlock(nnx.Module):
  def __init__(self, embed: int, heads: int, hidden: int, *, dtype, rngs: nnx.Rngs):
    self.ln1 = nnx.LayerNorm(embed, scale_init=partitioned(nnx.initializers.ones_init(), ('embed',)),
                             bias_init=partitioned(nnx.initializers.zeros_init(), ('embed',)), rngs=rngs)
    self.attention = nnx.MultiHeadAttention(
        num_heads=heads, in_features=embed, decode=False, dtype=dtype,
        kernel_init=partitioned(kernel_init, ('embed', 'heads', 'kv')),
        out_kernel_init=partitioned(kernel_init, ('heads', 'kv', 'embed')),
        bias_init=partitioned(nnx.initializers.zeros_init(), ('heads', 'kv')),
        out_bias_init=partitioned(nnx.initializers.zeros_init(), ('embed',)), rngs=rngs)
    self.ln2 = nnx.LayerNorm(embed, scale_init=partitioned(nnx.initializers.ones_init(), ('embed',)),
                             bias_init=partitioned(nnx.initializers.zeros_init(), ('embed',)), rngs=rngs)
    self.mlp = MlpBlock(embed, hidden, dtype=dtype, rngs=rngs)

  def __call__(self, x, mask):
    x = x + self.attention(self.ln1(x), mask=mask)
    return x + self.mlp(self.ln2(x))


class TransformerLM(nnx.Module):
  def __init__(self, vocab: int, seq_len: int, embed: int, heads: int, hidden: int, layers: int, *, dtype,
               rngs: nnx.Rngs):
    self.embed = nnx.Embed(vocab, embed, embedding_init=partitioned(embed_init, ('vocab', 'embed')), rngs=rngs)
    self.positions = nnx.Param(embed_init(rngs.params(), (seq_len, embed)), sharding_names=(None, 'embed'))
    self.blocks = nnx.List([DecoderBlock(embed, heads, hidden, dtype=dtype, rngs=rngs) for _ in range(layers)])
    self.ln = nnx.LayerNorm(embed, scale_init=partitioned(nnx.initializers.ones_init(), ('embed',)),
                            bias_init=partitioned(nnx.initializers.zeros_init(), ('embed',)), rngs=rngs)
    self.head = nnx.Linear(embed, vocab, kernel_init=partitioned(kernel_init, ('embed', 'vocab')), dtype=dtype,
                           rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens) + self.positions[...][: tokens.shape[1]]
    mask = nnx.make_causal_mask(tokens)
    for block in self.blocks:
      x = block(x, mask)
    return self.head(self.ln(x))


def build(cfg, rngs):
  """shardbench's entry point: the run's configuration and its random streams in, the module out."""
  m = cfg.model
  return TransformerLM(m.vocab_size, m.seq_len, m.embed_dim, m.num_heads, m.mlp_dim, m.num_layers,
                       dtype=jnp.dtype(cfg.precision.dtype), rngs=rngs)
