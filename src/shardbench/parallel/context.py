"""Context parallelism: the sequence split over the `seq` mesh axis, and attention over it.

Everything but attention works token by token, so with activations split along the sequence (the strategy's
table maps the logical 'seq' to the mesh's seq axis) only attention needs the other devices' rows:
- all-gather: each device gathers every key and value (a constraint that leaves the sequence whole; XLA writes the
  all-gather, and a reduce-scatter of their gradients in the backward) and attends its own queries to all of them;
- ring: keys and values stay split; in N steps each device attends its queries to the block it holds, then passes
  the block to the next device with a ppermute (N - 1 of them), keeping an online softmax (running max and sum in
  float32), as Liu et al.'s ring attention does, a tile of keys at a time. Its backward is flash attention's (a
  custom VJP): it keeps the device's q, k, v, output and each row's log-sum-exp, O(T/N) rows, recomputes each
  tile's scores, and passes each block back around the ring with its gradient so far (N - 1 ppermutes), so a
  device holds one tile of scores at a time and memory grows as T, not T^2. Key tiles wholly in a query run's
  future are never visited (the tile loop stops before them).

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


KEY_TILE = 512  # keys per tile: a device holds one (query run x KEY_TILE) tile of scores at a time

State = tuple[jax.Array, jax.Array, jax.Array]  # the online softmax's running max, sum and unnormalised output


@dataclass(frozen=True)
class _Ring:
    """What one device's ring attention is built from besides its q, k and v."""

    table: np.ndarray  # (devices, rows): the true positions of the rows each device holds, ascending in each run
    chunks: int  # contiguous runs of positions per device (head-tail: 2)
    tile: int  # keys per score tile, dividing a run
    causal: bool
    precision: jax.lax.Precision

    @property
    def devices(self) -> int:
        return self.table.shape[0]

    def runs(self, x: jax.Array, axis: int = 1) -> list[jax.Array]:
        """A device's rows (along `axis`) as its `chunks` runs of contiguous positions."""
        return jnp.split(x, self.chunks, axis=axis)

    def visible(self, qp: jax.Array, kp: jax.Array) -> jax.Array | int:
        """How many of a run's key tiles (at positions `kp`) hold a key some query at `qp` sees: all of them, or
        under the causal mask those that start at or before the last query (a run's positions ascend, so the
        tiles wholly in the future are its last ones, and the loops stop before them)."""
        tiles = kp.shape[0] // self.tile
        if not self.causal:
            return tiles
        return jnp.sum(kp.reshape(tiles, self.tile)[:, 0] <= qp.max())

    def tile_of(self, x: jax.Array, t: jax.Array, axis: int = 1) -> jax.Array:
        return jax.lax.dynamic_slice_in_dim(x, t * self.tile, self.tile, axis=axis)

    def masked(self, s: jax.Array, qp: jax.Array, kp: jax.Array, fill: float) -> jax.Array:
        return jnp.where(qp[:, None] >= kp[None, :], s, fill) if self.causal else s


def _attend_run(ring: _Ring, state: State, q: jax.Array, qp: jax.Array, k: jax.Array, v: jax.Array,
                kp: jax.Array) -> State:
    """One run of queries `q` (at positions `qp`) after one run of keys and values (at `kp`), a tile of keys at a
    time: the running max `m` and sum `l` (batch, heads, query) and unnormalised output `acc` (batch, heads,
    query, head_dim), all float32."""

    def tile(t: jax.Array, state: State) -> State:
        m, l, acc = state
        kt, vt, kpt = ring.tile_of(k, t), ring.tile_of(v, t), ring.tile_of(kp, t, axis=0)
        s = ring.masked(_scores(q, kt, ring.precision), qp, kpt, NEG)
        m_new = jnp.maximum(m, s.max(-1))
        # A row whose every key so far is masked has m_new = NEG, where exp(s - m_new) = 1: masked again.
        p = ring.masked(jnp.exp(s - m_new[..., None]), qp, kpt, 0.0)
        rescale = jnp.exp(m - m_new)
        pv = jnp.einsum("bhqk,bkhd->bhqd", p, vt.astype(jnp.float32), precision=ring.precision)
        return m_new, l * rescale + p.sum(-1), acc * rescale[..., None] + pv

    return jax.lax.fori_loop(0, ring.visible(qp, kp), tile, state)


def _grad_run(ring: _Ring, grads: State, q: jax.Array, qp: jax.Array, do: jax.Array, lse: jax.Array,
              delta: jax.Array, k: jax.Array, v: jax.Array, kp: jax.Array) -> State:
    """Flash attention's backward for one run of queries against one run of keys, a tile at a time: each tile's
    probabilities recomputed from its scores and the rows' log-sum-exp `lse`; `delta` = rowsum(dO * O). `grads`:
    float32 (dq of the query run, dk and dv of the key run), returned with this pair's share added."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    q32 = q.astype(jnp.float32)

    def tile(t: jax.Array, grads: State) -> State:
        dq, dk, dv = grads
        kt, vt, kpt = ring.tile_of(k, t), ring.tile_of(v, t), ring.tile_of(kp, t, axis=0)
        p = ring.masked(jnp.exp(_scores(q, kt, ring.precision) - lse[..., None]), qp, kpt, 0.0)
        dp = jnp.einsum("bqhd,bkhd->bhqk", do, vt.astype(jnp.float32), precision=ring.precision)
        ds = p * (dp - delta[..., None]) * scale
        dq = dq + jnp.einsum("bhqk,bkhd->bqhd", ds, kt.astype(jnp.float32), precision=ring.precision)
        dkt = ring.tile_of(dk, t) + jnp.einsum("bhqk,bqhd->bkhd", ds, q32, precision=ring.precision)
        dvt = ring.tile_of(dv, t) + jnp.einsum("bhqk,bqhd->bkhd", p, do, precision=ring.precision)
        return (dq, jax.lax.dynamic_update_slice_in_dim(dk, dkt, t * ring.tile, axis=1),
                jax.lax.dynamic_update_slice_in_dim(dv, dvt, t * ring.tile, axis=1))

    return jax.lax.fori_loop(0, ring.visible(qp, kp), tile, grads)


def _ring_forward(ring: _Ring, q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """One device's forward: its query runs against its own key/value block, then against each block the previous
    device passes on (N - 1 ppermutes, in a loop over the ring's steps). Returns the output and what the backward
    keeps, each O(T/N) rows: q, k, v, the block held last, the output and each row's log-sum-exp."""
    index = jax.lax.axis_index(SEQUENCE)
    table = jnp.asarray(ring.table)
    batch, rows, heads, dim = q.shape
    run = rows // ring.chunks
    qs, qps = ring.runs(q), ring.runs(table[index], axis=0)

    def attend(states: tuple[State, ...], kv: jax.Array, step: jax.Array | int) -> tuple[State, ...]:
        """The block of keys and values `kv` this device holds at `step`: device (index - step)'s."""
        ks, vs, kps = ring.runs(kv[0]), ring.runs(kv[1]), ring.runs(table[(index - step) % ring.devices], axis=0)
        return tuple(functools.reduce(lambda st, j: _attend_run(ring, st, qs[c], qps[c], ks[j], vs[j], kps[j]),
                                      range(ring.chunks), states[c]) for c in range(ring.chunks))

    def step(s: jax.Array, carry: tuple[tuple[State, ...], jax.Array]) -> tuple[tuple[State, ...], jax.Array]:
        states, kv = carry
        return attend(states, kv, s), jax.lax.ppermute(kv, SEQUENCE, [(i, (i + 1) % ring.devices)
                                                                      for i in range(ring.devices)])

    zero = (jnp.full((batch, heads, run), NEG, jnp.float32), jnp.zeros((batch, heads, run), jnp.float32),
            jnp.zeros((batch, heads, run, dim), jnp.float32))
    # N - 1 steps that each end passing the block on (keys and values stacked: one permute), then the last block.
    states, kv = jax.lax.fori_loop(0, ring.devices - 1, step, ((zero,) * ring.chunks, jnp.stack([k, v])))
    states = attend(states, kv, ring.devices - 1)
    out = jnp.concatenate([acc / l[..., None] for _, l, acc in states], axis=2)  # (batch, heads, rows, dim)
    out = out.transpose(0, 2, 1, 3).astype(q.dtype)
    lse = jnp.concatenate([m + jnp.log(l) for m, l, _ in states], axis=2)  # (batch, heads, rows)
    return out, (q, k, v, kv, out, lse)


def _ring_backward(ring: _Ring, saved: tuple[jax.Array, ...], dout: jax.Array
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One device's backward, the ring's steps in reverse from the block held last: each block's scores
    recomputed tile by tile, its gradient accumulated as it goes; the block and its gradient so far (float32,
    stacked: one permute) passed back to the previous device, N - 1 ppermutes, so that each block's gradient
    arrives whole at its own device at step 0."""
    q, k, v, kv, out, lse = saved
    index = jax.lax.axis_index(SEQUENCE)
    table = jnp.asarray(ring.table)
    do = dout.astype(jnp.float32)
    delta = jnp.einsum("bqhd,bqhd->bhq", do, out.astype(jnp.float32))
    qs, qps, dos = ring.runs(q), ring.runs(table[index], axis=0), ring.runs(do)
    lses, deltas = ring.runs(lse, axis=2), ring.runs(delta, axis=2)

    def grad(dqs: tuple[jax.Array, ...], kv: jax.Array, dkv: jax.Array, step: jax.Array | int
             ) -> tuple[tuple[jax.Array, ...], jax.Array]:
        ks, vs, kps = ring.runs(kv[0]), ring.runs(kv[1]), ring.runs(table[(index - step) % ring.devices], axis=0)
        dqs, dks, dvs = list(dqs), ring.runs(dkv[0]), ring.runs(dkv[1])
        for c in range(ring.chunks):
            for j in range(ring.chunks):
                dqs[c], dks[j], dvs[j] = _grad_run(ring, (dqs[c], dks[j], dvs[j]), qs[c], qps[c], dos[c], lses[c],
                                                   deltas[c], ks[j], vs[j], kps[j])
        return tuple(dqs), jnp.stack([jnp.concatenate(dks, axis=1), jnp.concatenate(dvs, axis=1)])

    def step(s: jax.Array, carry: tuple[tuple[jax.Array, ...], jax.Array, jax.Array]
             ) -> tuple[tuple[jax.Array, ...], jax.Array, jax.Array]:
        dqs, kv, dkv = carry
        dqs, dkv = grad(dqs, kv, dkv, ring.devices - 1 - s)
        moved = jax.lax.ppermute(jnp.concatenate([kv.astype(jnp.float32), dkv]), SEQUENCE,
                                 [(i, (i - 1) % ring.devices) for i in range(ring.devices)])
        return dqs, moved[:2].astype(kv.dtype), moved[2:]

    zeros = tuple(jnp.zeros(x.shape, jnp.float32) for x in qs)
    dqs, kv, dkv = jax.lax.fori_loop(0, ring.devices - 1, step, (zeros, kv, jnp.zeros(kv.shape, jnp.float32)))
    dqs, dkv = grad(dqs, kv, dkv, 0)  # this device's own block, its gradient now complete
    return jnp.concatenate(dqs, axis=1).astype(q.dtype), dkv[0].astype(k.dtype), dkv[1].astype(v.dtype)


def ring_local(q: jax.Array, k: jax.Array, v: jax.Array, *, table: np.ndarray, chunks: int, causal: bool,
               precision: jax.lax.Precision, key_tile: int = KEY_TILE) -> jax.Array:
    """One device's ring attention, inside a program manual over the seq axis: its queries `q` (rows at positions
    table[its index]) against the key/value blocks of every device. Each device's rows are `chunks` contiguous
    runs of positions; keys are taken `key_tile` at a time (the largest divisor of a run up to it and up to half the
    run). A custom VJP: the backward keeps O(T/N) rows and recomputes the scores, as flash attention does."""
    run = q.shape[1] // chunks
    # At least two tiles a run: a loop over one tile slices the whole run whatever the index, and XLA hoists that
    # slice, and the scores computed from it, out of the loop (computed even where the loop skips them, and kept).
    tile = next(t for t in range(min(max(run // 2, 1), key_tile), 0, -1) if run % t == 0)
    assert (np.diff(table.reshape(table.shape[0], chunks, run), axis=-1) == 1).all(), "runs of ascending positions"
    ring = _Ring(table, chunks, tile, causal, precision)
    attend = jax.custom_vjp(functools.partial(lambda ring, q, k, v: _ring_forward(ring, q, k, v)[0], ring))
    attend.defvjp(functools.partial(_ring_forward, ring), functools.partial(_ring_backward, ring))
    return attend(q, k, v)


def ring_attention(q: jax.Array, k: jax.Array, v: jax.Array, *, mesh: Mesh, qpos: np.ndarray, chunks: int,
                   causal: bool, precision: jax.lax.Precision, key_tile: int = KEY_TILE) -> jax.Array:
    """Ring attention over the seq axis of `mesh`: a program manual over seq alone (the other axes stay XLA's to
    partition: the batch over data, heads over model), each device's block of keys and values passed around."""
    devices = mesh.shape[SEQUENCE]
    spec = PartitionSpec(None, SEQUENCE, None, None)
    table = qpos.reshape(devices, -1)  # row i: the true positions device i holds

    def local(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return ring_local(q, k, v, table=table, chunks=chunks, causal=causal, precision=precision, key_tile=key_tile)

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
