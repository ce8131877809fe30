"""Next-token prediction with the Transformer LM: each example is seq_len + 1 tokens; the model reads the
first seq_len and is scored by cross-entropy on each next token. Reports tokens/s and perplexity."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from shardbench.config import Config
from shardbench.errors import ConfigError
from shardbench.models.lm import flops_per_example
from shardbench.tasks.base import Batch, Rows, Task, Terms
from shardbench.tasks.vision import cross_entropy


def check(cfg: Config) -> None:
    m = cfg.model
    if m.embed_dim % m.num_heads:
        raise ConfigError(f"embed dim {m.embed_dim} is not divisible by {m.num_heads} heads")
    if m.embed_dim % 2:
        raise ConfigError(f"embed dim {m.embed_dim} must be even for the sine/cosine position table")


def inputs(cfg: Config, batch: Batch, key: jax.Array, train: bool, rows: Rows) -> jax.Array:
    return batch["tokens"][:, :-1]


def terms(logits: jax.Array, batch: Batch) -> Terms:
    targets = batch["tokens"][:, 1:]
    seq = targets.shape[1]
    return Terms(cross_entropy(logits, targets).sum(-1), jnp.full(targets.shape[:1], seq, jnp.float32),
                 (logits.argmax(-1) == targets).astype(jnp.float32).sum(-1))


TASK = Task(
    kind="lm", unit="tokens", check=check, inputs=inputs, terms=terms,
    train_flops_per_example=lambda cfg: flops_per_example(cfg.model)["train"],
    units_per_example=lambda cfg: cfg.model.seq_len,
    formula="3 x batch x [L*(8*T*E^2 + 4*T^2*E + 4*T*E*M) + 2*T*E*V], T=seq_len (matmul FLOPs; attention "
            "counted in full although causal; backward = 2 x forward)",
    perplexity=True,
)
