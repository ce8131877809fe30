"""A mixture of experts in place of a Transformer block's MLP: top-k routing with a capacity per expert, written
as einsums over one-hot dispatch and combine tensors of shape [groups, tokens, experts, capacity] (GShard's and
Switch's "dropping" formulation, as MaxText's `layers/moe.py` writes it without megablox).

Each sequence is a group: its tokens compete for each expert's C = ceil(capacity_factor x tokens x k / experts)
slots, earlier tokens before later ones (each token's k choices together), so that which of a token's assignments
drop depends only on it and the tokens before it, and the language model stays causal; an assignment over capacity
is dropped (the token's residual passes the block unchanged for that expert) and counted. The experts' parameters
carry the logical axis 'expert'; the tokens dispatched to them are laid out [experts, groups, capacity, width] and
constrained to ('expert', 'batch', ...), so where a strategy splits experts over a mesh axis that also splits the
batch, XLA's partitioner moves them there and back with all-to-alls. The model names no mesh axis.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from shardbench.models.axes import BATCH, EMBED, EXPERT, MLP, SEQ, constrain, sequence_order


class MoEOutputs(NamedTuple):
    """What a language model with experts returns: its logits, and per sequence the load-balancing loss (summed
    over the blocks) and the assignments dropped over capacity (summed over the blocks), which the task adds to the
    objective and reports."""

    logits: jax.Array
    aux: jax.Array
    dropped: jax.Array


class Routing(NamedTuple):
    """Where each group's tokens go. combine [G, T, E, C]: the gate weight of token t in slot c of expert e (0 where
    it is not there); dispatch: the same as 0/1; aux [G]: Switch's load-balancing loss per group; dropped [G]: the
    token-to-expert assignments over capacity per group (a token routed to k experts counts once per expert it
    missed)."""

    combine: jax.Array
    dispatch: jax.Array
    aux: jax.Array
    dropped: jax.Array


def capacity(tokens: int, experts: int, top_k: int, factor: float) -> int:
    """Slots per expert in a group of `tokens`: ceil(factor x tokens x k / experts), at least 1. The factor is
    taken as the decimal it is written as (1.1 x 100 / 11 is 10 slots, not the 11 that float rounding gives)."""
    return max(1, math.ceil(Fraction(str(factor)) * tokens * top_k / experts))


def route(logits: jax.Array, top_k: int, slots: int, order: np.ndarray | None = None) -> Routing:
    """Top-k routing of router `logits` [G, T, E] into `slots` slots per expert. `order`: the true position of
    each row where the sequence is laid out in another order (context parallelism's head-tail chunks); slots still
    go by true position, so a layout routes and drops as the sequence in order does.

    Probabilities are the softmax over experts (float32); a token's k gates are its k largest probabilities (not
    renormalised: Switch's gate for k = 1). Slots are filled in (token, choice) order: token 0's first and second
    choices, then token 1's, and so on, an expert's slot for an assignment being the count of the assignments to it
    before (a cumulative sum over the T x k assignments, each token's k consecutive), as MaxText's dropping path
    does (`RoutedMoE.generate_masks` in its `layers/moe.py`: the expert mask reshaped to (batch, seq_len x k,
    experts) and summed cumulatively over axis 1). A token's slots, and so which of its assignments drop, depend
    only on it and the tokens before it: the language model, the only model with experts (validation refuses them
    elsewhere), stays causal. GShard's (choice, token) order, every token's first choice before any second one,
    would let a later token's first choice take an earlier token's slot, so that a token's output depends on the
    tokens after it. The load-balancing loss is Switch's E x sum_e f_e P_e per group, f_e the fraction of the
    group's T x k assignments that chose e (before capacity), P_e the mean probability of e: 1 where routing is
    uniform."""
    g, t, e = logits.shape
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    gates, index = jax.lax.top_k(probs, top_k)  # [G, T, k]
    chosen = jax.nn.one_hot(index, e, dtype=jnp.int32)  # [G, T, k, E]
    # Priority order (token, choice): the running count of earlier assignments to the same expert is the slot.
    in_order = chosen if order is None else chosen[:, np.argsort(order)]  # rows back to token order
    by_token = in_order.reshape(g, t * top_k, e)  # each token's k choices consecutive
    slot = (jnp.cumsum(by_token, axis=1) - 1).reshape(g, t, top_k, e)  # [G, T, k, E]
    if order is not None:
        slot = slot[:, order]  # each row's slots, in the layout's order again
    kept = chosen * (slot < slots)
    where = jax.nn.one_hot(jnp.where(kept > 0, slot, -1), slots, dtype=jnp.float32)  # -1: no slot (all zeros)
    dispatch = jnp.einsum("gtke,gtkec->gtec", kept.astype(jnp.float32), where)
    combine = jnp.einsum("gtk,gtke,gtkec->gtec", gates, kept.astype(jnp.float32), where)
    share = chosen.sum(axis=(1, 2)).astype(jnp.float32) / (t * top_k)  # f_e [G, E]
    aux = e * jnp.sum(share * probs.mean(axis=1), axis=-1)
    dropped = (chosen.sum(axis=(1, 2, 3)) - kept.sum(axis=(1, 2, 3))).astype(jnp.float32)
    return Routing(combine, dispatch, aux, dropped)


def experts_mlp(h: jax.Array, p: dict[str, jax.Array], *, top_k: int, capacity_factor: float,
                precision: jax.lax.Precision) -> tuple[jax.Array, jax.Array, jax.Array]:
    """h [B, S, M] (each sequence a group) through the experts: (output [B, S, M], aux [B], dropped [B]).
    `p`: router_kernel [M, E], expert1_kernel [E, M, H], expert1_bias [E, H], expert2_kernel [E, H, M],
    expert2_bias [E, M]."""
    dtype = h.dtype
    experts, seq = p["router_kernel"].shape[-1], h.shape[1]
    logits = jnp.einsum("gtm,me->gte", h, p["router_kernel"], precision=precision)
    r = route(logits, top_k, capacity(seq, experts, top_k, capacity_factor), sequence_order(seq))
    # Dispatch: tokens (split by group) to experts (split by expert): the all-to-all, where both are split.
    x = jnp.einsum("gtec,gtm->egcm", r.dispatch.astype(dtype), h, precision=precision)
    x = constrain(x, (EXPERT, BATCH, None, EMBED))
    y = jnp.einsum("egcm,emh->egch", x, p["expert1_kernel"], precision=precision) + p["expert1_bias"][:, None, None]
    y = constrain(jax.nn.gelu(y), (EXPERT, BATCH, None, MLP))
    y = jnp.einsum("egch,ehm->egcm", y, p["expert2_kernel"], precision=precision) + p["expert2_bias"][:, None, None]
    y = constrain(y, (EXPERT, BATCH, None, EMBED))
    # Return: each token's slots back to its group, weighted by its gates (empty slots weigh 0).
    out = jnp.einsum("gtec,egcm->gtm", r.combine.astype(dtype), y, precision=precision)
    return constrain(out, (BATCH, SEQ, EMBED)), r.aux, r.dropped


def expert_flops(tokens: int, embed: int, mlp: int, top_k: int) -> int:
    """Forward matmul FLOPs of one block's experts on `tokens` tokens: each token through k experts' two matmuls,
    4*T*k*E*M (the active experts only; the router's 2*T*E*experts is counted apart, dispatch and combine not at
    all: they move tokens, and a capacity slot left empty is not work)."""
    return 4 * tokens * top_k * embed * mlp
