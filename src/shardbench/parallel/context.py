"""Context parallelism: the sequence split over the `seq` mesh axis, and attention over it.

Everything but attention works token by token, so with activations split along the sequence (the strategy's
table maps the logical 'seq' to the mesh's seq axis) only attention needs the other devices' rows:
- all-gather: each device gathers every key and value (a constraint that leaves the sequence whole; XLA writes the
  all-gather, and a reduce-scatter of their gradients in the backward) and attends its own queries to all of them;
- ring: keys and values stay split; in N steps each device attends its queries to the block it holds, then passes
  the block to the next device with a ppermute (N - 1 of them), keeping an online softmax (running max and sum in
  float32), as Liu et al.'s ring attention does. A block wholly in a query chunk's future is skipped (a `cond`).

Under a causal mask, device i of N holding chunk i would find N - 1 - i of its N blocks empty (device 0 skips all
but one, device N - 1 none): the slowest device does the whole causal work. The head-tail order (torchtitan's
`headtail`) deals the sequence in 2N chunks and gives device i chunks i and 2N - 1 - i, so every device attends to
as many keys. The model lays its tokens out in that order with their true positions (`models.axes.sequence_order`),
and the mask is built from those positions.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from shardbench.config import ParallelConfig
from shardbench.models.axes import BATCH, HEADS, KV, Constraint, sequence_split
from shardbench.parallel.mesh import SEQUENCE
from shardbench.parallel.rules import Layout

NEG = -1e30  # a masked score: finite, so a row whose every key is masked so far keeps a finite running max


def uses_context(layout: Layout) -> bool:
    """A strategy that splits the sequence over a seq axis of more than one device."""
    return SEQUENCE in layout.strategy.axes and layout.shape.seq > 1


def chunks_per_device(order: str) -> int:
    """How many contiguous runs of the sequence each device holds: 2 under head-tail, else 1."""
    return 2 if order == "head-tail" else 1


def head_tail_order(length: int, devices: int) -> np.ndarray:
    """The positions laid out so that device i of `devices` holds chunks i and 2N-1-i of 2N equal chunks
    (length 16 over 2 devices: 0-3, 12-15 on device 0; 4-7, 8-11 on device 1)."""
    chunks = np.arange(length).reshape(2 * devices, length // (2 * devices))
    return chunks[[c for i in range(devices) for c in (i, 2 * devices - 1 - i)]].reshape(-1)


def positions(length: int, devices: int, order: str) -> np.ndarray:
    """The true position of each row of the sequence as it is laid out."""
    return head_tail_order(length, devices) if order == "head-tail" else np.arange(length)


def _scores(q: jax.Array, k: jax.Array, precision: jax.lax.Precision) -> jax.Array:
    """float32 (batch, heads, query, key) scores q.k / sqrt(head_dim)."""
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=precision, preferred_element_type=jnp.float32)
    return s / math.sqrt(q.shape[-1])


def gathered_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, qpos: np.ndarray, causal: bool,
                       precision: jax.lax.Precision, constrain: Constraint) -> jax.Array:
    """Each device's queries against every key and value: k and v constrained whole along the sequence (XLA
    all-gathers them over seq), the causal mask by the rows' true positions `qpos`."""
    k, v = (constrain(t, (BATCH, None, HEADS, KV)) for t in (k, v))
    s = _scores(q, k, precision)
    if causal:
        s = jnp.where(jnp.asarray(qpos[:, None] >= qpos[None, :]), s, NEG)
    w = jax.nn.softmax(s, axis=-1).astype(q.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", w, v, precision=precision)


def _block(state: tuple[jax.Array, jax.Array, jax.Array], q: jax.Array, k: jax.Array, v: jax.Array,
           qpos: jax.Array, kpos: jax.Array, causal: bool, precision: jax.lax.Precision
           ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One block of the online softmax: the running max `m` and sum `l` (batch, heads, query) and the unnormalised
    output `acc` (batch, heads, query, head_dim), all float32, after the keys `k` at positions `kpos`. The max is a
    constant of the result (it cancels in acc / l), so its gradient is stopped, as flash attention does."""
    m, l, acc = state
    s = _scores(q, k, precision)
    if causal:
        allowed = qpos[:, None] >= kpos[None, :]
        s = jnp.where(allowed, s, NEG)
    m_new = jax.lax.stop_gradient(jnp.maximum(m, s.max(-1)))
    p = jnp.exp(s - m_new[..., None])
    if causal:
        p = jnp.where(allowed, p, 0.0)
    rescale = jnp.exp(m - m_new)
    l = l * rescale + p.sum(-1)
    acc = acc * rescale[..., None] + jnp.einsum("bhqk,bkhd->bhqd", p, v.astype(jnp.float32), precision=precision)
    return m_new, l, acc


def ring_local(q: jax.Array, k: jax.Array, v: jax.Array, *, table: jax.Array, devices: int, chunks: int,
               causal: bool, precision: jax.lax.Precision) -> jax.Array:
    """One device's ring attention, inside a program manual over the seq axis: its queries `q` (rows at positions
    table[its index]) against the key/value blocks of every device, its own first, then each one the previous
    device passes on. Each device's rows are `chunks` contiguous runs of positions; a pair of runs whose keys all
    lie after its queries is skipped under `causal`."""
    index = jax.lax.axis_index(SEQUENCE)
    batch, rows, heads, dim = q.shape
    run = rows // chunks
    qpos = table[index]
    qs = [(q[:, c * run:(c + 1) * run], qpos[c * run:(c + 1) * run]) for c in range(chunks)]
    zero = (jnp.full((batch, heads, run), NEG, jnp.float32), jnp.zeros((batch, heads, run), jnp.float32),
            jnp.zeros((batch, heads, run, dim), jnp.float32))
    states = [zero] * chunks
    kv = jnp.stack([k, v])
    # Each block's scores are recomputed in the backward from its inputs (flash attention's trade), so that a device
    # need not keep the (rows x sequence) of them autodiff would. What XLA's CPU compiler makes of it, measured on
    # the long-context preset's LM: per device 335 MiB compiled at 4k tokens, 1,261 MiB at 8k against the
    # all-gather's 554 at 4k; still quadratic in the sequence (a ring step's block scores grow as (T/N)^2), and
    # the 16k run passed 20 GB on 4 simulated devices. A loop over the ring's steps kept more (every step's scores
    # stacked for the backward, inside the layer scan), with jax.checkpoint or a custom_vjp alike.
    block_step = jax.checkpoint(functools.partial(_block, causal=causal, precision=precision),
                                policy=jax.checkpoint_policies.nothing_saveable)
    for step in range(devices):
        source = (index - step) % devices
        kpos = table[source]
        block = kv
        for c, (qc, qp) in enumerate(qs):
            for j in range(chunks):
                kc, vc = block[0][:, j * run:(j + 1) * run], block[1][:, j * run:(j + 1) * run]
                kp = kpos[j * run:(j + 1) * run]

                def attend(st: tuple[jax.Array, ...], qc: jax.Array = qc, kc: jax.Array = kc, vc: jax.Array = vc,
                           qp: jax.Array = qp, kp: jax.Array = kp) -> tuple[jax.Array, ...]:
                    return block_step(st, qc, kc, vc, qp, kp)

                if causal:  # every key after every query: nothing to add
                    states[c] = jax.lax.cond(kp.min() > qp.max(), lambda st: st, attend, states[c])
                else:
                    states[c] = attend(states[c])
        if step < devices - 1:  # one block of keys and values (stacked: one permute) to the next device
            kv = jax.lax.ppermute(kv, SEQUENCE, [(i, (i + 1) % devices) for i in range(devices)])
    out = jnp.concatenate([acc / l[..., None] for _, l, acc in states], axis=2)  # (batch, heads, rows, dim)
    return out.transpose(0, 2, 1, 3).astype(q.dtype)


def ring_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, mesh: Mesh, qpos: np.ndarray, chunks: int,
                   causal: bool, precision: jax.lax.Precision) -> jax.Array:
    """Ring attention over the seq axis of `mesh`: a program manual over seq alone (the other axes stay XLA's to
    partition: the batch over data, heads over model), each device's block of keys and values passed around."""
    devices = mesh.shape[SEQUENCE]
    spec = PartitionSpec(None, SEQUENCE, None, None)

    def local(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        table = jnp.asarray(qpos.reshape(devices, -1))  # row i: the true positions device i holds
        return ring_local(q, k, v, table=table, devices=devices, chunks=chunks, causal=causal, precision=precision)

    return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec,
                         axis_names=frozenset({SEQUENCE}), check_vma=False)(q, k, v)


@dataclass(frozen=True)
class ContextSplit:
    """The `models.axes.SequenceSplit` a context-parallel step installs."""

    layout: Layout
    mode: str  # --parallel.context
    order_name: str  # --parallel.context-order

    @property
    def devices(self) -> int:
        return self.layout.shape.seq

    def order(self, length: int) -> np.ndarray | None:
        return head_tail_order(length, self.devices) if self.order_name == "head-tail" else None

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool,
               precision: jax.lax.Precision) -> jax.Array:
        qpos = positions(q.shape[1], self.devices, self.order_name)
        if self.mode == "ring":
            assert self.layout.mesh is not None
            return ring_attention(q, k, v, mesh=self.layout.mesh, qpos=qpos, chunks=chunks_per_device(
                self.order_name), causal=causal, precision=precision)
        return gathered_attention(q, k, v, qpos=qpos, causal=causal, precision=precision,
                                  constrain=self.layout.constrain)


@contextlib.contextmanager
def context_parallel(layout: Layout, parallel: ParallelConfig) -> Iterator[None]:
    """While tracing a step: attention over a sequence split over seq, where the layout splits it."""
    if not uses_context(layout):
        yield
        return
    with sequence_split(ContextSplit(layout, parallel.context, parallel.context_order)):
        yield
