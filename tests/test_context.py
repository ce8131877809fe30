"""Context parallelism (shardbench.parallel.context): ring and all-gather attention over a sequence split over the
seq axis give plain attention's outputs and gradients, causal or not, in head-tail order or in order; the ring
moves N - 1 key/value blocks by ppermute forward and N - 1 back (each with its gradient), as counted by hand, and
its compiled memory grows as the sequence, not its square; head-tail deals the chunks as torchtitan does; and the
layouts it cannot run are refused in one line before compiling."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shardbench import config as config_lib
from shardbench.errors import ConfigError
from shardbench.measure.comms import along_one_axis, count_collectives
from shardbench.measure.run_record import StepTimes
from shardbench.models.transformer import attention
from shardbench.parallel.context import gathered_attention, head_tail_order, positions, ring_attention
from shardbench.parallel.mesh import MESH_AXES, SEQUENCE
from shardbench.parallel.rules import make_layout
from shardbench.parsing import override
from shardbench.preflight import check_runnable
from shardbench.presets import get_preset
from shardbench.report.content import ReportedRun

BATCH, LENGTH, HEADS, DIM = 2, 16, 2, 4
N = 4  # devices on the seq axis; the other 2 of the 8 simulated devices on data


def test_head_tail_deals_chunk_i_and_2n_minus_1_minus_i() -> None:
    assert head_tail_order(16, 2).tolist() == [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11]
    order = head_tail_order(32, 4).reshape(4, 8)
    # Every device attends (causally) to as many keys: the sum of its positions + 1 is the same on each.
    work = (order + 1).sum(axis=1)
    assert (work == work[0]).all() and sorted(order.ravel().tolist()) == list(range(32))


def _qkv() -> tuple[jax.Array, jax.Array, jax.Array]:
    keys = jax.random.split(jax.random.key(0), 3)
    return tuple(jax.random.normal(k, (BATCH, LENGTH, HEADS, DIM), jnp.float32) for k in keys)  # type: ignore


def _plain(q: jax.Array, k: jax.Array, v: jax.Array, causal: bool) -> jax.Array:
    return attention(q, k, v, kind="einsum", precision=jax.lax.Precision.HIGHEST, causal=causal)


CASES = [("ring", True, "head-tail"), ("ring", True, "contiguous"), ("ring", False, "head-tail"),
         ("all-gather", True, "head-tail")]


@pytest.mark.parametrize(("mode", "causal", "order"), CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_split_attention_is_plain_attention(mode: str, causal: bool, order: str) -> None:
    """Outputs and the gradients of q, k and v against attention on the whole sequence in token order: the
    inputs are laid out in the split's order (the model's embedding does that), the outputs and gradients put
    back in token order."""
    layout = make_layout("dp+cp", f"data=2,seq={N}", jax.devices()[:2 * N])
    pos = positions(LENGTH, N, order)
    back = np.argsort(pos)
    chunks = 2 if order == "head-tail" else 1
    weights = jax.random.normal(jax.random.key(1), (BATCH, LENGTH, HEADS, DIM))

    def split(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        q, k, v = (t[:, pos] for t in (q, k, v))
        if mode == "ring":
            out = ring_attention(q, k, v, mesh=layout.mesh, qpos=pos, chunks=chunks, causal=causal,
                                 precision=jax.lax.Precision.HIGHEST)
        else:
            out = gathered_attention(q, k, v, qpos=pos, causal=causal, precision=jax.lax.Precision.HIGHEST,
                                     constrain=layout.constrain)
        return out[:, back]

    def loss(fn, q, k, v):  # noqa: ANN001, ANN202
        return (fn(q, k, v) * weights).sum()

    q, k, v = _qkv()
    want = _plain(q, k, v, causal)
    want_grads = jax.grad(lambda *a: loss(lambda *b: _plain(*b, causal), *a), argnums=(0, 1, 2))(q, k, v)
    got, got_grads = jax.jit(lambda q, k, v: (split(q, k, v), jax.grad(
        lambda *a: loss(split, *a), argnums=(0, 1, 2))(q, k, v)))(q, k, v)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{mode} {order} causal={causal}: output")
    for name, g, w in zip("qkv", got_grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{mode} {order} causal={causal}: d{name}")


def test_ring_passes_n_minus_1_blocks_each_way() -> None:
    """One attention forward and backward on seq=4: 3 collective-permutes forward, each of one device's keys
    and values stacked (2 x batch x rows x heads x head_dim float32), and 3 back, each a block again with its
    gradient so far stacked on it (twice the bytes: the backward recomputes the scores from the keys and values
    rather than keep every block it saw); every one along the seq axis alone, none of anything else."""
    layout = make_layout("dp+cp", f"data=2,seq={N}", jax.devices()[:2 * N])
    pos = positions(LENGTH, N, "head-tail")

    def f(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return ring_attention(q, k, v, mesh=layout.mesh, qpos=pos, chunks=2, causal=True,
                              precision=jax.lax.Precision.DEFAULT).sum()

    q, k, v = _qkv()
    sharding = jax.sharding.NamedSharding(layout.mesh, jax.sharding.PartitionSpec("data", SEQUENCE))
    hlo = jax.jit(jax.grad(f, argnums=(0, 1, 2)), in_shardings=(sharding,) * 3).lower(q, k, v).compile().as_text()
    report = count_collectives(hlo)
    block = 2 * (BATCH // 2) * (LENGTH // N) * HEADS * DIM * 4
    permutes = report.by_kind["collective-permute"]
    moved = (N - 1) * block + (N - 1) * 2 * block
    assert (permutes.count, permutes.bytes) == (2 * (N - 1), moved), report.by_kind
    ring = along_one_axis(report.ops, layout.shape.sizes, MESH_AXES.index(SEQUENCE))
    assert (ring.count, ring.bytes) == (2 * (N - 1), moved)
    assert set(report.by_kind) == {"collective-permute"}, report.by_kind
    # The counts are exact, so no loop is of unknown length for them: the ring's loops over key tiles, whose trip
    # counts XLA leaves unrecorded, hold no collective (every ring run's report said it undercounted).
    assert report.unknown_trip_counts == 0


def test_ring_memory_grows_as_the_sequence_not_its_square() -> None:
    """The compiled temporaries of one causal ring attention, forward and backward, on seq=4 at 1k and 8k tokens
    (keys 64 at a time: both lengths cut their runs into tiles of that size). A device keeps O(T/N) rows and one
    (run x 64) tile of scores at a time, so 8x the tokens should cost about 8x the bytes; keeping each block's
    scores for the backward, (T/N) x T per device, costs 64x (as a ring differentiated by autodiff keeps them). The
    bound between them, their geometric mean, parts the two."""
    layout = make_layout("cp", f"seq={N}", jax.devices()[:N])
    sharding = jax.sharding.NamedSharding(layout.mesh, jax.sharding.PartitionSpec(None, SEQUENCE))

    def temp_bytes(length: int) -> int:
        pos = positions(length, N, "head-tail")

        def f(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
            return ring_attention(q, k, v, mesh=layout.mesh, qpos=pos, chunks=2, causal=True,
                                  precision=jax.lax.Precision.DEFAULT, key_tile=64).sum()

        x = jax.ShapeDtypeStruct((1, length, HEADS, 8), jnp.float32)
        compiled = jax.jit(jax.grad(f, argnums=(0, 1, 2)), in_shardings=(sharding,) * 3).lower(x, x, x).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    short, long = 1024, 8192
    linear, quadratic = long / short, (long / short) ** 2
    ratio = temp_bytes(long) / temp_bytes(short)
    assert ratio < (linear * quadratic) ** 0.5, f"{ratio:.1f}x the temporaries for {linear:.0f}x the tokens"


def _cfg(**overrides: object) -> config_lib.Config:
    base = {"model.embed_dim": 32, "model.num_heads": 4, "model.mlp_dim": 64, "model.num_layers": 2,
            "model.seq_len": 16, "train.batch_size": 16, "parallel.devices": 8}
    preset = str(overrides.pop("preset", "lm-seed"))
    return override(get_preset(preset), {**base, **overrides})


REFUSED = [
    ({"parallel.strategy": "cp", "parallel.mesh": "seq=8", "model.seq_len": 24}, "does not split into 2 x seq = 16"),
    ({"parallel.strategy": "cp", "parallel.mesh": "seq=8", "model.seq_len": 12,
      "parallel.context_order": "contiguous"}, "does not split into 8 blocks"),
    # Each model's way to a sequence that splits, in its own flags: a vit user sets no sequence length
    ({"parallel.strategy": "cp", "parallel.mesh": "seq=8", "model.seq_len": 20,
      "parallel.context_order": "contiguous"}, "use a --model.seq-len that is a multiple of 8 or another seq size$"),
    # where contiguous blocks would fit, the line offers them as a third way
    ({"parallel.strategy": "cp", "parallel.mesh": "seq=8", "model.seq_len": 24},
     "use a --model.seq-len that is a multiple of 16, another seq size, or --parallel.context-order contiguous$"),
    ({"preset": "vit-tiny", "parallel.strategy": "cp", "parallel.mesh": "seq=8",
      "parallel.context_order": "contiguous"},
     "a sequence of 65 rows does not split into 8 blocks .*: use --model.pool mean .64 rows: its patches, without "
     "the class token."),
    ({"preset": "mlp-small", "parallel.strategy": "cp", "parallel.mesh": "seq=8"}, "has no attention"),
    ({"parallel.strategy": "dp", "parallel.mesh": "8", "parallel.context": "ring"}, "does not split"),
    # The chunks' order means as little as the ring without a seq axis (it was accepted, silently).
    ({"parallel.strategy": "dp+tp", "parallel.mesh": "4x2", "parallel.context_order": "contiguous"},
     "--parallel.context-order contiguous orders the sequence's chunks over a seq axis, which --strategy dp+tp does "
     "not split: use cp, dp+cp, fsdp+cp or cp+tp with --mesh seq=N, or leave --parallel.context-order at head-tail"),
    ({"preset": "vit-tiny", "parallel.strategy": "cp", "parallel.mesh": "seq=8", "model.lsa": True,
      "model.pool": "mean", "model.patch_size": 8}, "--model.lsa"),
    ({"parallel.strategy": "cp", "parallel.mesh": "seq=8", "parallel.spmd": "shard_map"}, "only jit builds"),
    ({"parallel.strategy": "dp", "parallel.mesh": "8", "parallel.sequence_parallel": True}, "has no model axis"),
    ({"parallel.strategy": "cp+tp", "parallel.mesh": "model=2,seq=4", "parallel.sequence_parallel": True},
     "already split over seq"),
]


@pytest.mark.parametrize(("overrides", "says"), REFUSED, ids=[s for _, s in REFUSED])
def test_refused_before_compiling(overrides: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("+", r"\+")) as err:
        check_runnable(_cfg(**overrides))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("length", [12, 20, 28, 14, 22, 26])
def test_the_contiguous_order_is_advised_only_where_it_splits(length: int) -> None:
    """A sequence the head-tail order cannot split over seq=4 (8 chunks) is given --parallel.context-order
    contiguous as a way out only where that order's 4 blocks split it (12, 20, 28; it was advised for 14, 22 and
    26 too, and then refused there); the advice, taken, is accepted."""
    with pytest.raises(ConfigError) as err:
        check_runnable(_cfg(**{"parallel.strategy": "dp+cp", "parallel.mesh": "data=2,seq=4", "model.seq_len": length}))
    advised = "--parallel.context-order contiguous" in str(err.value)
    assert advised == (length % 4 == 0)
    if advised:
        check_runnable(_cfg(**{"parallel.strategy": "dp+cp", "parallel.mesh": "data=2,seq=4", "model.seq_len": length,
                               "parallel.context_order": "contiguous"}))

def test_auto_picks_cp_for_a_seq_axis() -> None:
    _, layout, _ = check_runnable(_cfg(**{"parallel.mesh": "data=2,seq=4"}))
    assert layout.strategy.name == "dp+cp" and layout.shape.seq == 4
    _, layout, _ = check_runnable(_cfg(**{"parallel.mesh": "model=2,seq=4"}))
    assert layout.strategy.name == "cp+tp"


def test_inspect_shows_each_devices_sequence_blocks() -> None:
    """16 tokens over seq=4 in head-tail order: 8 chunks of 2, device i holding chunks i and 7 - i; the mesh
    (data=2, seq=4) puts seq block i on devices i and 4 + i."""
    from shardbench.inspect import inspect

    out = inspect(_cfg(**{"parallel.strategy": "dp+cp", "parallel.mesh": "data=2,seq=4", "parallel.context": "ring"}))
    for line in ("seq 0: tokens 0-1, 14-15 on devices 0,4", "seq 3: tokens 6-9 on devices 3,7",
                 "3 ppermutes per layer forward"):
        assert line in out, out


def test_planner_leaves_cp_out_unless_named_and_meshes_it_over_seq() -> None:
    from shardbench.plan.candidates import DEFAULT, candidates

    assert not {"cp", "dp+cp", "fsdp+cp", "cp+tp"} & set(DEFAULT)
    found = sorted((c.strategy, c.mesh) for c in candidates(8, 8, ["cp", "dp+cp"], ["none"], ["float32"]))
    assert found == [("cp", "seq=8"), ("dp+cp", "data=2,seq=4"), ("dp+cp", "data=4,seq=2")]


@pytest.mark.slow
def test_planner_counts_the_rings_blocks(tmp_path) -> None:  # noqa: ANN001
    """The planner's compiled figures for cp with ring attention, in order (contiguous: no reordering of the
    sequence): 2 layers x (N - 1) = 3 blocks forward and 3 back, each forward one a device's keys and values, 2 x
    batch 4 x 16 / 4 rows x width 32 x 4 bytes = 4,096 bytes, each backward one a block with its gradient (8,192
    bytes): 2 x 3 x 12,288 = 73,728 bytes a step. And two more, XLA's: it splits the
    (batch, 17) token ids along seq too, and gives each device its neighbour's edge for the task's shift by one
    (inputs and targets: int32 [4, 3] and [4, 2], 80 bytes)."""
    from shardbench.plan.compile import compile_candidate

    cfg = _cfg(**{"parallel.strategy": "cp", "parallel.mesh": "seq=4", "parallel.devices": 4, "train.batch_size": 4,
                  "parallel.context": "ring", "parallel.context_order": "contiguous",
                  "data.cache_dir": str(tmp_path)})
    result = compile_candidate(cfg, 4)
    permutes = [c for c in result["collectives"] if c["kind"] == "collective-permute"]
    assert sum(c["count"] for c in permutes) == 2 * 2 * (N - 1) + 2
    assert sum(c["bytes"] for c in permutes) == 2 * 3 * (N - 1) * 2 * 4 * (16 // N) * 32 * 4 + 80


# The long-context sweep's own records (benchmarks/long-context-cpu.md): their configurations and memory as run,
# the ring's step times set by each test, so that the tests hold when the sweep is run again.
LONG_CONTEXT_RUNS = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "long-context-cpu"


def _context_runs() -> tuple[list[ReportedRun], list[int], dict[int, float]]:
    """The records, the lengths at which both context modes ran (ascending), and the all-gather's step (ms) at
    each."""
    from shardbench.report.write import load_runs

    runs = load_runs(LONG_CONTEXT_RUNS)[0]
    modes: dict[int, dict[str, ReportedRun]] = {}
    for run in runs:
        if run.ok and run.config.get("parallel.strategy") == "cp":
            modes.setdefault(run.config["model.seq_len"], {})[run.config["parallel.context"]] = run
    both = sorted(t for t, m in modes.items() if len(m) == 2)
    assert len(both) >= 4, sorted(modes)
    return runs, both, {t: modes[t]["all-gather"].step_median * 1e3 for t in both}  # type: ignore[operator]


def _ring_findings(runs: list[ReportedRun], ring_ms: dict[int, float]) -> str:
    """The report's sentence on the records with the ring's median step set (ms) at each length given, through the
    record's own dataclasses; its p90 scaled alike, so that the record keeps its own spread (a p90 left at the old
    median would make a spread of the gap, and the report call the two a tie)."""
    from shardbench.report.context import context_findings

    def timed(run: ReportedRun) -> ReportedRun:
        tokens = run.config["model.seq_len"]
        if run.config.get("parallel.context") != "ring" or tokens not in ring_ms or run.record is None:
            return run
        recorded = run.m.step_time_s or StepTimes()
        scale = ring_ms[tokens] / 1e3 / (recorded.median or ring_ms[tokens] / 1e3)
        steps = dataclasses.replace(recorded, median=ring_ms[tokens] / 1e3,
                                    p90=None if recorded.p90 is None else recorded.p90 * scale)
        measured = dataclasses.replace(run.m, step_time_s=steps)
        return dataclasses.replace(run, record=dataclasses.replace(run.record, measurements=measured))

    (sentence,) = context_findings([timed(r) for r in runs])
    return sentence


def test_the_report_says_the_ring_was_faster_at_every_length() -> None:
    """The ring's step half the all-gather's at every length: faster from the shortest; each length's times and
    memory per device as recorded; a length the ring alone ran (the longest) named; dp, fsdp and tp left out."""
    runs, both, gathered = _context_runs()
    sentence = _ring_findings(runs, {t: ms / 2 for t, ms in gathered.items()})
    assert (f"on this machine the ring's step was the faster at every length measured, from the shortest, "
            f"{both[0]:,} tokens.") in sentence, sentence
    ring, other = (next(r for r in runs if r.config.get("parallel.context") == mode and r.config["model.seq_len"]
                        == both[-1] and r.ok) for mode in ("ring", "all-gather"))
    assert (f"{both[-1]:,} tokens: ring {gathered[both[-1]] / 2:,.1f} ms, all-gather {gathered[both[-1]]:,.1f} ms "
            f"({ring.m.memory.total_bytes / 2**20:,.1f} MiB against "  # type: ignore[union-attr]
            f"{other.m.memory.total_bytes / 2**20:,.1f} MiB per device)") in sentence  # type: ignore[union-attr]
    assert sentence.count(" tokens: ring ") == len(both)
    alone = max(r.config["model.seq_len"] for r in runs if r.config.get("parallel.context") == "ring")
    # What the all-gather would have held there: batch 4 x 2 heads x T^2 float32 scores a layer, on all devices.
    assert alone > both[-1] and f"The ring alone ran at {alone:,} tokens" in sentence
    assert f"({4 * 2 * alone**2 * 4 / 2**30:,.1f} GiB at {alone:,} tokens)" in sentence, sentence


def test_the_report_says_from_which_length_the_ring_overtakes() -> None:
    """The ring's step twice the all-gather's at the shortest length and the third, half at the others: it
    overtakes from the fourth on (faster at the second, then not again at the third)."""
    runs, both, gathered = _context_runs()
    slower = (both[0], both[2])
    sentence = _ring_findings(runs, {t: ms * (2 if t in slower else 0.5) for t, ms in gathered.items()})
    assert (f"the ring overtakes the all-gather from {both[3]:,} tokens on (its step was not the faster at "
            f"{both[0]:,}, {both[2]:,} tokens, also the faster at {both[1]:,} tokens).") in sentence, sentence


@pytest.mark.parametrize("short", [0, 2], ids=["nowhere", "only-the-two-shortest"])
def test_the_report_says_when_the_ring_never_overtakes(short: int) -> None:
    """The ring's step twice the all-gather's at every length, or at all but the `short` shortest (half there):
    no crossover within the lengths measured, and where it was the faster, said."""
    runs, both, gathered = _context_runs()
    faster = both[:short]
    sentence = _ring_findings(runs, {t: ms * (0.5 if t in faster else 2) for t, ms in gathered.items()})
    never = f"the ring never overtakes the all-gather within the lengths measured ({both[0]:,} to {both[-1]:,} tokens)"
    said = never + (f": its step was the faster at {both[0]:,}, {both[1]:,} tokens, not at {both[-1]:,}."
                    if short else ".")
    assert said in sentence, sentence
