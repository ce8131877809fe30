"""Next-token prediction with the Transformer LM: each example is seq_len + 1 tokens; the model reads the
first seq_len and is scored by cross-entropy on each next token. Reports tokens/s and perplexity."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from shardbench.config import Config
from shardbench.errors import ConfigError
from shardbench.models.lm import flops_per_example
from shardbench.models.moe import MoEOutputs
from shardbench.models.transformer import check_heads
from shardbench.tasks.base import Batch, MoETerms, Rows, Task, Terms
from shardbench.tasks.vision import cross_entropy


def check(cfg: Config) -> None:
    m = cfg.model
    if m.num_experts and m.top_k > m.num_experts:
        raise ConfigError(f"--model.top-k {m.top_k} routes each token to more experts than the "
                          f"{m.num_experts} there are (--model.num-experts): use a top-k of at most {m.num_experts}")
    check_heads(m)
    if m.embed_dim % 2:
        raise ConfigError(f"--model.embed-dim {m.embed_dim} must be even for the sine/cosine position table")


def inputs(cfg: Config, batch: Batch, key: jax.Array, train: bool, rows: Rows) -> jax.Array:
    return batch["tokens"][:, :-1]


def terms(outputs: jax.Array | MoEOutputs, batch: Batch) -> Terms:
    """Cross-entropy per sequence; with experts, their load-balancing loss and drops beside it."""
    logits = outputs.logits if isinstance(outputs, MoEOutputs) else outputs
    targets = batch["tokens"][:, 1:]
    seq = targets.shape[1]
    moe = MoETerms(outputs.aux, outputs.dropped) if isinstance(outputs, MoEOutputs) else None
    return Terms(cross_entropy(logits, targets).sum(-1), jnp.full(targets.shape[:1], seq, jnp.float32),
                 (logits.argmax(-1) == targets).astype(jnp.float32).sum(-1), moe)


TASK = Task(
    kind="lm", unit="tokens", check=check, inputs=inputs, terms=terms,
    train_flops_per_example=lambda cfg: flops_per_example(cfg.model)["train"],
    units_per_example=lambda cfg: cfg.model.seq_len,
    formula="3 x batch x [L*(8*T*E^2 + 4*T^2*E + 4*T*E*M) + 2*T*E*V], T=seq_len (matmul FLOPs; attention "
            "counted in full although causal; backward = 2 x forward); with X experts, top-k, each block's 4*T*E*M "
            "is 4*T*k*E*M + 2*T*E*X (the active experts and the router)",
    perplexity=True,
)
