"""Whether a layout can run, said before anything compiles: the SPMD style (`--spmd`) against the layout, the
model's dims against the layout's tactics, and the batch against its data axis."""

from __future__ import annotations

import math

import jax

from shardbench.config import Config
from shardbench.devices import process_count
from shardbench.errors import ConfigError
from shardbench.models.axes import EXPERT, LAYERS
from shardbench.models.spec import ModelSpec, state_shapes
from shardbench.models.vit import num_tokens
from shardbench.parallel.mesh import EXPERT as EXPERT_AXIS
from shardbench.parallel.mesh import DATA, MODEL, SEQUENCE, STAGE
from shardbench.parallel.rules import Layout, flat_by_path
from shardbench.parallel.strategies import STRATEGIES, Largest


def check_style(style: str, layout: Layout) -> None:
    """Say before any compilation when a style cannot run a layout."""
    if style != "jit" and STAGE in layout.strategy.axes:
        raise ConfigError(f"--spmd {style} cannot run --strategy {layout.strategy.name}: its pipeline stages are "
                          f"vmapped over the stage axis in one global program, which only jit builds: use --spmd jit")
    if style != "jit" and SEQUENCE in layout.strategy.axes:
        raise ConfigError(f"--spmd {style} cannot run --strategy {layout.strategy.name}: its attention over the "
                          f"sequence split over seq is written into the global program, which only jit builds: use "
                          f"--spmd jit")
    if style != "jit" and layout.sequence_parallel:
        raise ConfigError(f"--spmd {style} with --parallel.sequence-parallel: the sequence's split over model is an "
                          f"activation layout of the global program, which only jit builds: use --spmd jit")
    if style == "pmap":
        if not hasattr(jax, "pmap"):
            raise ConfigError(f"--spmd pmap: this JAX ({jax.__version__}) no longer provides jax.pmap; use "
                              f"--spmd shard_map for explicit per-device programs")
        if process_count() > 1:
            # Its program maps over every process's devices, but the step's outputs are fetched as one process's
            # arrays: the first step's metrics would span devices this process cannot read.
            raise ConfigError(f"--spmd pmap runs in one process, but this run has {process_count()} "
                              f"processes: across processes use --spmd jit or shard_map")
        if layout.shape.model > 1:
            raise ConfigError(f"--spmd pmap maps over one axis of devices but --mesh {layout.shape} has a model axis "
                              f"of {layout.shape.model}: use a 1-D mesh (--mesh {layout.shape.size}) with --strategy "
                              f"dp, or --spmd jit / shard_map for 2-D meshes")
        if not layout.strategy.replicates_everything:
            raise ConfigError(f"--spmd pmap replicates parameters on every device, with their gradients and "
                              f"optimizer state (data parallelism), so it cannot run --strategy "
                              f"{layout.strategy.name}: use --strategy dp, or --spmd shard_map / jit")


def unsplit_note(layout: Layout, mesh: str = "") -> str | None:
    """A strategy whose name promises axes the mesh gives one device each (`fsdp+pp+tp` on `--mesh 8`: all on its
    first axis, as documented) splits nothing over them: said as a note, since the run's name still says them.
    None where every axis it uses is split, or none is (one device), or where `mesh` (the --mesh given) names
    each such axis itself (`stage=1,model=2`: a one-stage reference, on purpose)."""
    axes = layout.strategy.axes
    named = {part.split("=")[0].strip() for part in mesh.lower().split(",") if "=" in part}
    if "x" in mesh.lower() and "=" not in mesh:  # 'AxB' names data and model ('8x1': a model axis of one)
        named |= {DATA, MODEL}
    whole = [axis for axis in axes if layout.shape[axis] == 1 and axis not in named]
    if not whole or len(whole) == len(axes):
        return None
    many = len(whole) > 1
    return (f"strategy {layout.strategy.name} on mesh {layout.shape}: its {' and '.join(whole)} "
            f"{'axes have one device each' if many else 'axis has one device'}, so nothing is split over "
            f"{'them' if many else 'it'}; a mesh naming {'their sizes splits them' if many else 'its size splits it'} "
            f"(--mesh {','.join(f'{a}=N' for a in axes)})")


def layout_notes(spec: ModelSpec, layout: Layout, mesh: str = "") -> list[str]:
    """The notes a run's layout gets before it trains, and inspect and a sweep give too (`unsplit_note`,
    `nothing_over_model_note`, `whole_arrays_note`), those that apply."""
    return [note for note in (unsplit_note(layout, mesh), nothing_over_model_note(spec, layout),
                              whole_arrays_note(spec, layout)) if note]


def nothing_over_model_note(spec: ModelSpec, layout: Layout) -> str | None:
    """A model of your own none of whose parameters names an axis the strategy's table maps to the model axis:
    split over more than one device there, it splits nothing (it ran as copies, saying only "tp on mesh 1x8")."""
    if not spec.custom or MODEL not in layout.strategy.axes or layout.shape.model <= 1:
        return None
    shapes = flat_by_path(spec.shapes)
    if any(MODEL in jax.tree.leaves(tuple(layout.param_spec(axes, tuple(shapes[path]))))
           for path, axes in flat_by_path(spec.axes).items()):
        return None
    return (f"{layout.strategy.name} splits none of this model's parameters over the model axis: none names an axis "
            f"its table maps (name them with nnx.with_partitioning, or map yours with --rules NAME=AXIS)")


# Arrays a splitting tactic leaves whole are said where they hold at least this part of the parameters: a bias of 10
# classes is not worth a line, a kernel that 8 divides in no dim is.
WHOLE_SHARE = 0.05


def whole_arrays_note(spec: ModelSpec, layout: Layout) -> str | None:
    """Parameters that an FSDP or ZeRO tactic (`Largest`) would split over its axis but that no dim of theirs the
    axis divides: they stay whole on every device, which only their PartitionSpec would show. Said where they hold
    at least WHOLE_SHARE of the parameters' elements; None elsewhere."""
    axes, shapes = flat_by_path(spec.axes), flat_by_path(spec.shapes)
    total = sum(math.prod(shape) for shape in shapes.values()) or 1
    strategy = layout.strategy
    found: list[tuple[str, str, dict[str, tuple[int, ...]]]] = []  # (what, axis, the arrays left whole)
    for what, tactics in (("parameters", strategy.params), ("optimizer state", strategy.optimizer_tactics),
                          ("gradients", strategy.gradient_tactics)):
        axis = next((t.axis for t in tactics if isinstance(t, Largest) and layout.shape[t.axis] > 1), None)
        if axis is not None:
            whole = {path: tuple(shapes[path]) for path in axes
                     if axis not in layout.placed(tactics, axes[path], tuple(shapes[path]))}
            if sum(math.prod(shape) for shape in whole.values()) / total >= WHOLE_SHARE:
                found.append((what, axis, whole))
    if not found:
        return None
    _, axis, whole = found[0]
    size, one = layout.shape[axis], len(whole) == 1
    part = sum(math.prod(shape) for shape in whole.values()) / total
    largest = sorted(whole, key=lambda p: -math.prod(whole[p]))
    named = ", ".join(f"{p} {whole[p]}" for p in largest[:3]) + (f" and {len(largest) - 3} more"
                                                                if len(largest) > 3 else "")
    kinds = [what for what, _, _ in found]
    kinds = ", ".join(kinds[:-1]) + (" and " if len(kinds) > 1 else "") + kinds[-1]
    return (f"{strategy.name} splits {named} over {axis} in no dim, since no dim it may split divides by {size}, "
            f"so {'it stays' if one else 'they stay'} whole in every device's {kinds} ({part:.0%} of the model's "
            f"elements); sizes divisible by {size} would split {'it' if one else 'them'}")


def check_layout(spec: ModelSpec, layout: Layout) -> None:
    """Every dim of the model's parameters, and of its other variables, that a tactic splits divides by its axis."""
    layout.check_divisible(spec.axes, spec.shapes, spec.axis_fields)
    if spec.state_axes:
        layout.check_divisible(spec.state_axes, state_shapes(spec), spec.axis_fields)


def sequence_length(cfg: Config) -> int:
    """The rows attention runs over: the lm's tokens, the vit's tokens (patches, and the class token), 0 for the
    mlp."""
    if cfg.model.kind == "lm":
        return cfg.model.seq_len
    if cfg.model.kind == "vit" and not cfg.model.factory:
        return num_tokens(cfg.model, cfg.data.image_size)
    return 0


def _sequence_advice(cfg: Config, sequence: int, chunks: int) -> str:
    """How this model's sequence becomes a multiple of `chunks`, in the flags that set it: the lm's length; the
    vit's patches, with the class token of --model.pool cls on top (which mean pooling leaves out)."""
    if cfg.model.kind == "lm":
        return f"a --model.seq-len that is a multiple of {chunks}"
    if cfg.model.kind == "vit" and not cfg.model.factory:
        patches = sequence - (1 if cfg.model.pool == "cls" else 0)
        if patches != sequence and patches % chunks == 0:
            return f"--model.pool mean ({patches} rows: its patches, without the class token)"
        return f"a --model.patch-size or --data.image-size whose tokens make a multiple of {chunks} rows"
    return f"a sequence that is a multiple of {chunks}"


def check_context(cfg: Config, layout: Layout) -> None:
    """Context parallelism (cp) needs a model whose attention goes through shardbench's (the lm and the vit), a
    sequence that splits into the seq axis's blocks (head-tail: 2 x seq chunks), and attention that its own
    replaces (einsum's, without LSA); --parallel.context ring and --parallel.context-order contiguous mean nothing
    without it. Sequence parallelism needs tp's model axis, and a sequence the model axis divides."""
    kind, custom, sequence = cfg.model.kind, bool(cfg.model.factory), sequence_length(cfg)
    context, order, attention, lsa = (cfg.parallel.context, cfg.parallel.context_order, cfg.model.attention,
                                      cfg.model.lsa)
    name, shape = layout.strategy.name, layout.shape
    if SEQUENCE not in layout.strategy.axes:
        if context != "all-gather":
            raise ConfigError(f"--parallel.context {context} passes keys and values around a seq axis, which "
                              f"--strategy {name} does not split: use cp, dp+cp, fsdp+cp or cp+tp with --mesh "
                              f"seq=N, or leave --parallel.context at all-gather")
        if order != "head-tail":
            raise ConfigError(f"--parallel.context-order {order} orders the sequence's chunks over a seq axis, which "
                              f"--strategy {name} does not split: use cp, dp+cp, fsdp+cp or cp+tp with --mesh seq=N, "
                              f"or leave --parallel.context-order at head-tail")
    else:
        if custom or kind == "mlp":
            what = ("a model of your own does not run shardbench's attention" if custom
                    else "the mlp has no attention")
            raise ConfigError(f"--strategy {name} splits the sequence that attention runs over, but {what}: use the "
                              f"lm or the vit, or dp, fsdp or tp")
        if attention in ("fused", "cudnn") or lsa:
            what = "--model.lsa" if lsa else f"--model.attention {attention}"
            raise ConfigError(f"--strategy {name} computes attention over the split sequence itself (einsum scores, "
                              f"{context}), which {what} would replace: use --model.attention einsum"
                              f"{' without --model.lsa' if lsa else ''}, or a strategy without cp")
        chunks = 2 * shape.seq if order == "head-tail" else shape.seq
        if sequence % chunks:
            what = f"2 x seq = {chunks} chunks (head-tail)" if order == "head-tail" else f"{chunks} blocks"
            contiguous_fits = order == "head-tail" and sequence % shape.seq == 0  # else that advice is refused too
            raise ConfigError(f"--strategy {name}: a sequence of {sequence} rows does not split into {what} "
                              f"(mesh {shape}): use {_sequence_advice(cfg, sequence, chunks)}"
                              f"{', another seq size' if contiguous_fits else ' or another seq size'}"
                              f"{', or --parallel.context-order contiguous' if contiguous_fits else ''}")
    if layout.sequence_parallel:
        if MODEL not in layout.strategy.axes or shape.model == 1:
            raise ConfigError(f"--parallel.sequence-parallel splits tp's LayerNorm and dropout regions along the "
                              f"sequence over model, but --strategy {name} on mesh {shape} has no model axis: use tp, "
                              f"dp+tp or fsdp+tp with --mesh model=N")
        if SEQUENCE in layout.strategy.axes:
            raise ConfigError(f"--parallel.sequence-parallel with --strategy {name}: the sequence is already split "
                              f"over seq (cp), and splitting it over model too is not built: leave out one of them")
        if sequence % shape.model:
            raise ConfigError(f"--parallel.sequence-parallel: a sequence of {sequence} rows does not split over the "
                              f"model axis ({shape.model} devices): use a multiple of {shape.model}")


def check_batch(flag: str, size: int, layout: Layout) -> None:
    """A batch splits evenly over the data axis, and over the processes that each read their own share of it."""
    divisor = layout.data_size
    if size % divisor == 0:
        divisor = math.lcm(divisor, layout.process_share(size)[1])
    if size % divisor:
        raise ConfigError(
            f"{flag} {size} is not divisible by the data-parallel size {divisor} ({layout.strategy.name} on "
            f"mesh {layout.shape}): use a multiple of {divisor}"
        )


def check_accumulation(k: int, batch: int, spec: ModelSpec, layout: Layout) -> None:
    """`--train.grad-accum K` splits each data shard's examples into K microbatches of equal size, and a model
    that keeps batch statistics would normalise each microbatch by its own, which no full batch does."""
    if k == 1:
        return
    per = batch // layout.data_size
    if per % k:
        works = [str(d) for d in range(2, per + 1) if per % d == 0]
        instead = (f"--train.grad-accum {' or '.join(works[:5])}{' or more' if len(works) > 5 else ''}" if works
                   else "--train.grad-accum 1")
        raise ConfigError(f"--train.grad-accum {k} does not divide the {per} examples per data shard (--batch-size "
                          f"{batch} over {layout.data_size} data shards, {layout.strategy.name} on mesh "
                          f"{layout.shape}): use {instead}, or a batch of {k * layout.data_size * -(-per // k)}")
    if spec.has_statistics:
        raise ConfigError(f"--train.grad-accum {k}: the model keeps BatchNorm statistics, which would be each "
                          f"microbatch's rather than the batch's: train it with --train.grad-accum 1")


def _divisors(n: int) -> list[int]:
    return [d for d in range(2, n + 1) if n % d == 0]


def check_pipeline(microbatches: int, batch: int, grad_accum: int, spec: ModelSpec, layout: Layout,
                   random_layers: tuple[str, ...] = (), schedule: str = "gpipe", repeats: int = 1,
                   stack: str = "--model.num-layers") -> None:
    """A pipeline needs a stack of layers that splits into equal stages (S x R chunks under the circular
    schedule), and microbatches that split each data shard's examples (of each accumulated microbatch) evenly;
    --parallel.microbatches, --parallel.schedule and --parallel.repeats mean nothing without one.
    `random_layers` names the settings that are on and draw random masks in every layer (dropout, stochastic
    depth): the pipeline runs every microbatch through a stage with the same draws, which is not one device's
    training, so they are refused rather than silently correlated. `stack`: what sets the stack's depth, as the
    advice names it (--model.num-layers, with the mlp's num_layers - 1; your model's own stack)."""
    name, shape = layout.strategy.name, layout.shape
    if repeats > 1 and schedule != "circular":
        raise ConfigError(f"--parallel.repeats {repeats} loops microbatches through the stages, which only "
                          f"--parallel.schedule circular does (not {schedule}): add --parallel.schedule circular, "
                          f"or leave --parallel.repeats at 1")
    if STAGE not in layout.strategy.axes:
        if microbatches:
            raise ConfigError(f"--parallel.microbatches {microbatches} splits the batch for pipeline stages, which "
                              f"--strategy {name} does not have: use a pipeline strategy "
                              f"({', '.join(n for n, s in STRATEGIES.items() if STAGE in s.axes)}) with a stage axis "
                              f"(--mesh stage=N), or --train.grad-accum to split a batch without stages")
        if schedule != "gpipe":
            raise ConfigError(f"--parallel.schedule {schedule} orders the work of pipeline stages, which --strategy "
                              f"{name} does not have: use --strategy pp or dp+pp with a stage axis (--mesh stage=N), "
                              f"or leave --parallel.schedule at gpipe")
        return
    if spec.custom and spec.stacks != 1:
        raise ConfigError(f"--strategy {name} splits into stages the one stack of layers a model hands to "
                          f"shardbench.models.axes.run_stack; your model hands it {spec.stacks}: stack its layers on a "
                          f"'layers' axis and run them through run_stack once (examples/stacked_mlp.py), or use dp, "
                          f"fsdp or tp")
    if spec.has_statistics:
        raise ConfigError(f"--strategy {name} runs the batch as microbatches, and a model that keeps batch "
                          f"statistics (BatchNorm) would normalise each by its own, which no full batch does: use "
                          f"dp, fsdp or tp")
    flat_axes, flat_shapes = flat_by_path(spec.axes), flat_by_path(spec.shapes)
    depths = {path: tuple(flat_shapes[path])[axes.index(LAYERS)] for path, axes in sorted(flat_axes.items())
              if LAYERS in axes}
    if not any(depths.values()):
        raise ConfigError(f"--strategy {name}: the model has no stacked layers (no parameter with a 'layers' dim, "
                          f"or a stack of none) to split into stages: use dp, fsdp or tp, or a deeper stack "
                          f"({stack})")
    stages = shape.stage
    if schedule == "circular":
        _check_chunks(depths, stages, repeats, name, shape, stack)
    for path, depth in depths.items():
        if depth % stages:
            raise ConfigError(f"--strategy {name}: the model's {depth} stacked layers (parameter {path}) do not "
                              f"split into {stages} equal stages (mesh {shape}): use {_stage_meshes(depth, layout)}, "
                              f"or a stack that is a multiple of {stages} ({stack})")
    m = microbatches or stages
    per = batch // layout.data_size // grad_accum
    # A batch that does not split over the data shards is said by the batch's own checks (check_batch,
    # check_accumulation), in their words.
    if batch % (layout.data_size * grad_accum) == 0 and per % m:
        near = sorted(sorted(_divisors(per), key=lambda d: (abs(d - m), d))[:5])  # the counts nearest the one asked
        instead = f"--parallel.microbatches {' or '.join(map(str, near))}" if near else "--parallel.microbatches 1"
        default = "" if microbatches else " (one per stage)"
        accumulated = f" and {grad_accum} accumulated microbatches" if grad_accum > 1 else ""
        raise ConfigError(f"--parallel.microbatches {m}{default} does not divide the {per} examples per data shard "
                          f"(--batch-size {batch} over {layout.data_size} data shard(s){accumulated}, {name} on mesh "
                          f"{shape}): use {instead}, or a batch of {-(-per // m) * m * layout.data_size * grad_accum}")
    if schedule == "circular" and repeats > 1 and m < stages:
        works = [d for d in _divisors(per) if d >= stages]
        instead = f"--parallel.microbatches {' or '.join(map(str, works[:5]))}" if works else "--parallel.repeats 1"
        raise ConfigError(f"--parallel.schedule circular: {m} microbatches cannot loop through {stages} stages "
                          f"(a microbatch's next pass would start before its last one ends): use {instead}")
    if schedule == "1f1b" and grad_accum > 1:
        raise ConfigError(f"--parallel.schedule 1f1b with --train.grad-accum {grad_accum}: 1F1B holds at most "
                          f"{stages} microbatches' activations however many flow, so accumulation buys nothing: "
                          f"use --parallel.microbatches {m * grad_accum} and --train.grad-accum 1, or "
                          f"--parallel.schedule gpipe")
    if random_layers:
        raise ConfigError(f"--strategy {name}: {' and '.join(random_layers)} would draw the same masks for every "
                          f"microbatch of a stage, which the pipeline does not yet vary: set "
                          f"{' '.join(f'{flag} 0' for flag in random_layers)}, or use a strategy without stages")


def _stage_meshes(depth: int, layout: Layout) -> str:
    """The stage counts that split `depth` layers, each as the mesh would hold it (its product is the device
    count): on the same devices, where the strategy has other axes to take the rest ('stage=2 with the other
    axes over 4 devices'), else with the devices the mesh's other axes then need ('stage=3 on 6 devices')."""
    shape = layout.shape
    others, rebalance = shape.size // shape.stage, len(layout.strategy.axes) > 1
    works = [f"stage={d} with the other axes over {shape.size // d} devices" if rebalance and shape.size % d == 0
             else f"stage={d} on {d * others} devices" for d in _divisors(depth)]
    return f"a mesh with {', or '.join(works)}" if works else "a mesh without a stage axis"


def _check_chunks(depths: dict[str, int], stages: int, repeats: int, name: str, shape: object,
                  stack: str) -> None:
    """The circular schedule splits each stack into stages x repeats equal chunks."""
    for path, depth in depths.items():
        if depth % (stages * repeats):
            works = [str(r) for r in range(1, depth // stages + 1) if depth % (stages * r) == 0]
            instead = f"--parallel.repeats {' or '.join(works)}" if works else f"a mesh with fewer than {stages} stages"
            raise ConfigError(f"--strategy {name} --parallel.schedule circular: the model's {depth} stacked layers "
                              f"(parameter {path}) do not split into {stages} stages x {repeats} repeats = "
                              f"{stages * repeats} equal chunks (mesh {shape}): use {instead}, or a stack that is a "
                              f"multiple of {stages * repeats} ({stack})")


def check_experts(spec: ModelSpec, layout: Layout, style: str, kind: str) -> None:
    """Expert parallelism needs experts, and a mixture of experts runs where its routing statistics reach the
    step: under jit, outside pipeline stages (the stages pass activations alone from one to the next). `kind`: the
    built-in model's (only the lm's blocks take experts)."""
    has_experts = any(EXPERT in axes for axes in flat_by_path(spec.axes).values())
    name = layout.strategy.name
    if EXPERT_AXIS in layout.strategy.axes and not has_experts:
        how = ("name a parameter dim 'expert' (nnx.with_partitioning, or --rules NAME=expert for a name of "
               "yours)" if spec.custom else "use --preset lm-moe or --model.num-experts N" if kind == "lm" else
               f"only the lm's blocks take experts (--model.num-experts), not the {kind}'s: use --preset lm-moe")
        raise ConfigError(f"--strategy {name} splits a mixture's experts over the expert axis, and this model has "
                          f"none (no parameter with an 'expert' dim): {how}, or a strategy without ep")
    if not has_experts:
        return
    if STAGE in layout.strategy.axes:
        raise ConfigError(f"--strategy {name}: a mixture of experts does not run in pipeline stages yet (its "
                          f"load-balancing loss and drops would have to travel between stages): use dp, fsdp, tp or "
                          f"an ep strategy")
    if style != "jit":
        raise ConfigError(f"--spmd {style}: a mixture of experts runs under --spmd jit only (its all-to-all comes "
                          f"from XLA's partitioner, and only jit's step reports its drops): use --spmd jit")
