"""A model's structure without its values (`ModelSpec`): its parameters' logical axes and shapes, its other
variables, and how it is called, traced from its construction without materialising anything. The built-in
models and a model of your own (`shardbench.models.custom`, linen ones through flax's bridge) come through
this one door; the train state and the steps read only the spec.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax import traverse_util

from shardbench.config import Config
from shardbench.errors import ConfigError, platform_fault
from shardbench.models import axis_fields, build_model, custom
from shardbench.models.axes import RunStack, stack_runner

Params = dict[str, Any]


def _is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def stored_state(state: nnx.State) -> Params:
    """A module's non-parameter variables as TrainState holds them: a pure dict, typed PRNG keys as their raw
    data (which checkpoints and every array utility take as they are)."""
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else jnp.asarray(x), nnx.to_pure_dict(state))


@dataclass(frozen=True)
class ModelSpec:
    """A model's structure without its values: enough to shard, check and rebuild it."""

    graphdef: nnx.GraphDef
    abstract: nnx.State  # parameters as ShapeDtypeStructs, with their logical axes
    axes: Params  # logical axes per parameter, as a nested dict
    shapes: Params
    axis_fields: dict[str, str]  # which configuration field each logical axis comes from
    takes_rng: bool = True  # the model's __call__ takes the step's key as `rng`
    unmapped: tuple[str, ...] = ()  # a model of your own: axis names no strategy table maps (kept whole)
    # A model of your own: its other variables (abstract), their axes (None = replicated) and stored shapes.
    state_abstract: nnx.State | None = None
    state_axes: Params = field(default_factory=dict)
    state_stored: Params = field(default_factory=dict)  # ShapeDtypeStructs of the stored form (keys as uint32)
    state_kinds: tuple[str, ...] = ()  # the Variable types among them, e.g. ('BatchStat', 'RngCount', 'RngKey')
    custom: bool = False  # a model of your own: switched with train()/eval(), called by its own conventions
    takes_rngs: bool = False  # its __call__ takes an nnx.Rngs as `rngs`
    mode: tuple[str, bool] | None = None  # (keyword, its value in training) of a declared mode argument
    mutable: tuple[str, ...] = ()  # a linen module through the bridge: the collections its call updates
    axis_names: tuple[str, ...] = ()  # collective axis names the model's layers name (BatchNorm axis_name=)
    # How many stacks of layers its call hands to `models.axes.run_stack` (the built-in models one; a model of
    # your own as many as tracing its call counts): what a pipeline splits into stages.
    stacks: int = 1
    # A model of your own: where it holds a linen module through the bridge with no parameters yet ('' = itself).
    bare_bridges: tuple[str, ...] = ()
    unused_rules: tuple[str, ...] = ()  # a model of your own: --rules names that none of its variables give

    def axis_notes(self) -> list[str]:
        """What `train`'s first line and `inspect` say of a model of your own's axis names: those no strategy
        table maps (kept whole), and --rules names that none of its variables give (doing nothing)."""
        notes = []
        if self.unmapped:
            notes.append(f"axes no table maps, kept whole: {', '.join(self.unmapped)} (map one with --rules "
                         f"NAME=AXIS)")
        if self.unused_rules:
            notes.append(f"--rules names what no variable of this model names, so it does nothing: "
                         f"{', '.join(self.unused_rules)}")
        return notes

    @property
    def has_statistics(self) -> bool:
        """Whether the model keeps batch statistics (BatchNorm), which depend on how the batch is split."""
        return "BatchStat" in self.state_kinds

    def _state(self, stored: Params, fold: jax.Array | None) -> nnx.State:
        """The non-parameter variables from their stored form; `fold` is folded into every RNG key (a
        per-device stream under the explicit styles), for this call only."""
        state = jax.tree.map(lambda x: x, self.state_abstract)  # fresh Variables for this trace
        flat = traverse_util.flatten_dict(stored)
        values = {}
        for path, var in nnx.to_flat_state(state):
            value, like = flat[path], var.get_value()
            if _is_key(like):
                value = jax.random.wrap_key_data(value, impl=like.dtype._impl)
                value = value if fold is None else jax.random.fold_in(value, fold)
            values[path] = value
        nnx.replace_by_pure_dict(state, traverse_util.unflatten_dict(values))
        return state

    def apply(self, params: Params, model_state: Params, inputs: jax.Array, rng: jax.Array | None, *,
              train: bool = True, fold: jax.Array | None = None) -> tuple[jax.Array, Params]:
        """Run the model on `params` and `model_state` (pure dicts, as held in TrainState): its outputs and its
        non-parameter variables as the call left them (BatchNorm's running averages, advanced RNG counts).
        A model of your own is in training or evaluation mode as `train` says, and gets `rng` by the
        convention its __call__ takes (`rng=key`, `rngs=nnx.Rngs(key)`); `rng=` gets None in evaluation."""
        state = jax.tree.map(lambda x: x, self.abstract)  # fresh Variables for this trace
        nnx.replace_by_pure_dict(state, params)
        if not self.custom:
            model = nnx.merge(self.graphdef, state)
            return (model(inputs, rng=rng) if self.takes_rng else model(inputs)), model_state
        model = nnx.merge(self.graphdef, state, self._state(model_state, fold))
        if train:
            model.train()
        else:
            model.eval()
        kwargs: dict[str, Any] = {}
        if self.takes_rng:
            kwargs["rng"] = rng if train else None
        if self.takes_rngs:
            kwargs["rngs"] = nnx.Rngs(rng if rng is not None else jax.random.key(0))
        if self.mode is not None:
            kwargs[self.mode[0]] = self.mode[1] if train else not self.mode[1]
        if self.mutable:
            kwargs["mutable"] = list(self.mutable) if train else False
        out = model(inputs, **kwargs)
        if not train:  # evaluation leaves every variable as it was (the bridge draws from its stream anyway)
            return out, model_state
        after = stored_state(nnx.state(model, nnx.Not(nnx.Param)))
        # The keys themselves never move (a stream advances its count): keep the unfolded ones. Every variable
        # keeps its dtype (a counter that `+= 1.0` promotes would not fit its checkpoint or the donated state).
        keys = {p for p, v in nnx.to_flat_state(self.state_abstract) if _is_key(v.get_value())}
        flat_after, flat_before = traverse_util.flatten_dict(after), traverse_util.flatten_dict(model_state)
        merged = {p: (flat_before[p] if p in keys else v.astype(flat_before[p].dtype)) for p, v in flat_after.items()}
        return out, traverse_util.unflatten_dict(merged) if merged else {}

    def _one_device_call(self, train: bool) -> Callable[[Params, Params, jax.Array], Any]:
        """(params, model state, inputs) -> outputs on one device, the model's collective axis names bound (each
        over one device) as the explicit styles bind them."""
        def call(p: Params, st: Params, x: jax.Array) -> Any:
            fn = lambda x1: self.apply(p, st, x1, jax.random.key(0), train=train)[0]  # noqa: E731
            for name in self.axis_names:
                fn = jax.vmap(fn, axis_name=name)
                x = x[None]
            out = fn(x)
            for _ in self.axis_names:
                out = jax.tree.map(lambda leaf: leaf[0], out)
            return out

        return call

    def trace_outputs(self, params: Params, inputs: Any, *, train: bool = True) -> Any:
        """The training (or, `train=False`, evaluation) call's outputs as ShapeDtypeStructs (nothing compiles)."""
        return jax.eval_shape(self._one_device_call(train), params, self.state_stored, inputs)

    def traced_train_flops(self, inputs: jax.ShapeDtypeStruct) -> float | None:
        """XLA's count of the FLOPs of one training call's forward and backward (the loss value and the
        parameters' gradients) on `inputs`, on one device and unsharded: the same figure whatever the layout (a
        compiled per-device program counts the work every device repeats once per device). A loop body counts
        once, as in any XLA cost analysis.

        Lowered for the host's CPU and never compiled: an accelerator's plugin (CUDA's, TPU's) gives no cost
        analysis of a program it has not compiled. Where the CPU cannot take it (JAX_PLATFORMS without cpu, an
        accelerator-only kernel), the one-device program is compiled for the default device instead. None where
        neither gives a count."""
        call = self._one_device_call(train=True)

        def objective(p: Params, st: Params, x: jax.Array) -> jax.Array:
            return sum((jnp.sum(leaf.astype(jnp.float32)) for leaf in jax.tree.leaves(call(p, st, x))),
                       jnp.float32(0))

        # value_and_grad: a step computes its loss, so the forward stays even where the gradient alone would not
        # need it (a linear model)
        step = jax.jit(jax.value_and_grad(objective))
        args = (nnx.to_pure_dict(self.abstract), self.state_stored, inputs)
        try:
            host = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])  # this process's
            on_host = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=host), args)
            flops = _cost_flops(lambda: step.lower(*on_host).cost_analysis())
        except RuntimeError:  # no CPU backend in this process
            flops = None
        return flops if flops is not None else _cost_flops(lambda: step.lower(*args).compile().cost_analysis())


def _cost_flops(analysis: Callable[[], Any]) -> float | None:
    """The "flops" of an XLA cost analysis, or None where it gives none or fails (a program that backend cannot
    lower or compile: the count is missing, the run is not)."""
    try:
        cost = analysis()
    except Exception:  # noqa: BLE001
        return None
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    flops = (cost or {}).get("flops")
    return float(flops) if flops else None


def describe_model(cfg: Config) -> ModelSpec:
    """Trace the model's construction abstractly: no parameter is materialised."""
    model = _build_abstract(cfg)
    if not cfg.model.factory:
        graphdef, abstract = nnx.split(model, nnx.Param)
        return ModelSpec(graphdef, abstract, param_axes(abstract), param_shapes(abstract), axis_fields(cfg))
    graphdef, abstract, rest = nnx.split(model, nnx.Param, ...)
    rules = custom.parse_rules(cfg.parallel.rules)
    axes, unmapped = custom.logical_axes(abstract, rules)
    state_axes, state_stored, kinds = _state_layout(cfg, rest, rules)
    spec = ModelSpec(graphdef, abstract, axes, param_shapes(abstract), axis_fields(cfg), custom.takes_rng(model),
                     unmapped, rest, state_axes, state_stored, kinds, custom=True,
                     takes_rngs=custom.takes_rngs(model), mode=custom.mode_argument(cfg, model),
                     mutable=custom.bridge_collections(cfg, model), axis_names=custom.axis_names(model),
                     bare_bridges=tuple(custom.uninitialised_bridges(model)))
    spec = replace(spec, unused_rules=tuple(sorted(set(rules) - custom.declared_names(abstract, rest))))
    _check_mode_declared(cfg, spec)
    spec = _with_traced_axis_names(cfg, spec)
    if spec.axis_names and cfg.parallel.spmd == "jit":
        raise ConfigError(
            f"--model {cfg.model.factory}: names the collective axis '{spec.axis_names[0]}', which --spmd jit "
            f"does not bind: use --spmd shard_map or pmap, or drop axis_name= (under jit statistics are global)")
    if len(spec.axis_names) > 1:
        raise ConfigError(
            f"--model {cfg.model.factory}: names the collective axes {', '.join(spec.axis_names)}; only the data "
            f"axis is bound: give every layer the same axis_name")
    return spec


def _build_abstract(cfg: Config) -> nnx.Module:
    """The model with every array a ShapeDtypeStruct; a failure is one line (ConfigError): the user's code,
    sys.exit included, or a built-in model that its --model.* settings cannot build."""
    try:
        return nnx.eval_shape(lambda: build_model(cfg, nnx.Rngs(cfg.train.seed)))
    except ConfigError:
        raise
    except (Exception, SystemExit) as err:  # noqa: BLE001 - reported in one line below (Ctrl-C stays an interrupt)
        platform = platform_fault(err) if isinstance(err, Exception) else None
        if platform is not None:  # JAX_PLATFORMS names a platform JAX cannot start: not the model's settings
            raise platform from None
        if not cfg.model.factory:
            if isinstance(err, SystemExit):
                raise
            raise ConfigError(f"the {cfg.model.kind} model cannot be built from this configuration"
                              f"{_named_in(cfg, err)}: {first_line(err)}; check its --model.* settings") from None
        held = NOT_AN_ARRAY.search(first_line(err))
        if held:  # a Variable holding a Python object, which no traced step can carry
            path = "/".join(re.findall(r"\['([^']+)'\]", held.group(2))) or held.group(2)
            raise ConfigError(f"--model {cfg.model.factory}: the Variable {path} holds a {held.group(1)}, not an "
                              f"array: store jnp.asarray(...), or a plain attribute for a constant") from None
        raise ConfigError(f"--model {cfg.model.factory}: building the model failed: {first_line(err)}") from None


def _named_in(cfg: Config, err: BaseException) -> str:
    """' (--model.FIELD N)' for the first integer model setting whose value the error message quotes, else ''."""
    text = str(err)
    for name, value in vars(cfg.model).items():
        if isinstance(value, int) and not isinstance(value, bool) and value > 1 and re.search(
                rf"(?<!\d){value}(?!\d)", text):
            return f" (--model.{name.replace('_', '-')} {value})"
    return ""


def _check_mode_declared(cfg: Config, spec: ModelSpec) -> None:
    """A linen module whose call updates collections (BatchNorm's `batch_stats`) must be told train or evaluate:
    without a mode argument its own default (training) would run in evaluation too, where nothing may change."""
    if not spec.mutable or spec.mode is not None:
        return
    where = custom.load(cfg.model.factory).file or "its file"
    raise ConfigError(
        f"--model {cfg.model.factory}: the linen module updates {', '.join(spec.mutable)} but declares no mode "
        f"argument, so evaluation would run it in training mode: add mode_argument = \"train\" (or "
        f"\"deterministic\", ...) to {where}, or pass --model.mode-argument train")


def _state_layout(cfg: Config, rest: nnx.State, rules: dict[str, str]) -> tuple[Params, Params, tuple[str, ...]]:
    """Per non-parameter variable: its logical axes (all None, i.e. replicated, unless its metadata names
    them), its stored ShapeDtypeStruct, and the Variable types present. A value that is not an array, which
    no step can carry, is refused naming the variable."""
    kinds: set[str] = set()
    for path, var in nnx.to_flat_state(rest):
        value = var.get_value()
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            raise ConfigError(
                f"--model {cfg.model.factory}: {type(var).__name__} {'/'.join(map(str, path))} holds a "
                f"{type(value).__name__}, not an array: store jnp.asarray(...), or a plain attribute for a constant")
        kinds.add(type(var).__name__)
    stored = jax.eval_shape(stored_state, rest)
    flat_stored = traverse_util.flatten_dict(stored)
    flat_axes = {path: (axes if len(axes) == len(flat_stored[path].shape)  # a key's raw data has one more dim
                        else (None,) * len(flat_stored[path].shape))
                 for path, axes in traverse_util.flatten_dict(custom.logical_axes(rest, rules)[0]).items()}
    return traverse_util.unflatten_dict(flat_axes) if flat_axes else {}, stored, tuple(sorted(kinds))


NOT_AN_ARRAY = re.compile(r"returned a value of type <class '(\w+)'> at output component (\S+)")
UNBOUND = re.compile(r"unbound axis name: ([^\s.]+)")


def example_input(cfg: Config, rows: int = 2) -> tuple[jax.ShapeDtypeStruct, tuple[int, ...], str]:
    """A model of your own: `rows` examples of its task's input, the output shape its task scores, and what that
    is."""
    b, m = rows, cfg.model
    dtype = jnp.dtype(cfg.precision.dtype)
    if m.kind == "lm":
        return (jax.ShapeDtypeStruct((b, m.seq_len), jnp.int32), (b, m.seq_len, m.vocab_size),
                "logits (batch, positions, --model.vocab-size)")
    if m.kind == "mlp":
        return (jax.ShapeDtypeStruct((b, m.input_dim), dtype), (b, m.num_classes),
                "values (batch, --model.num-classes outputs)")
    size = cfg.data.image_size
    return (jax.ShapeDtypeStruct((b, size, size, 3), dtype), (b, m.num_classes),
            "logits (batch, --model.num-classes)")


def check_outputs(cfg: Config, spec: ModelSpec) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    """Trace (never compile) the model on one batch of its task's input, as the step calls it and as evaluation
    does: each output must be the floating-point array the task scores, or one line says what came back and
    what was expected. Returns both outputs (training's, evaluation's), on which the file's `loss` is traced
    next (`shardbench.tasks.check_own_functions`)."""
    example, expected, what = example_input(cfg)
    outputs = []
    for train in (True, False):
        out = _traced_call(cfg, spec, example, train)
        shape = getattr(out, "shape", None)
        if shape is None:  # a tuple, a dict, None: not one array
            held = (f"a {type(out).__name__}" + (f" of {', '.join(map(str, out))}" if isinstance(out, dict) else "")
                    if out is not None else "None")
            raise ConfigError(f"--model {cfg.model.factory} returned {held}, not one array, for input "
                              f"{example.shape}{'' if train else ' in evaluation mode'}; --task {cfg.model.task} "
                              f"scores one array of {what} = {expected} (a file's loss(outputs, batch) gets that "
                              f"array too): return it alone")
        if shape != expected:
            raise ConfigError(f"--model {cfg.model.factory} returned shape {shape} for input {example.shape}"
                              f"{'' if train else ' in evaluation mode'}; --task {cfg.model.task} scores {what} "
                              f"= {expected}")
        dtype = jnp.dtype(out.dtype)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ConfigError(f"--model {cfg.model.factory} returned {dtype.name} outputs"
                              f"{'' if train else ' in evaluation mode'}, which no gradient flows through: "
                              f"--task {cfg.model.task} scores floating-point {what} (e.g. float32)")
        outputs.append(out)
    return outputs[0], outputs[1]


def _traced_call(cfg: Config, spec: ModelSpec, example: jax.ShapeDtypeStruct, train: bool) -> Any:
    """The outputs of one traced call, or one line saying how calling the user's model failed."""
    try:
        return spec.trace_outputs(nnx.to_pure_dict(spec.abstract), example, train=train)
    except (Exception, SystemExit) as err:  # noqa: BLE001 - the user's code: one line (Ctrl-C stays an interrupt)
        bare = spec.bare_bridges
        hint = (f"; the linen module {'at ' + bare[0] + ' ' if bare[0] else ''}through nnx.bridge.ToNNX has no "
                f"parameters: call nnx.bridge.lazy_init(model, example_input) in build, as examples/linen_mlp.py "
                f"does" if bare else "")
        raise ConfigError(f"--model {cfg.model.factory}: calling it{'' if train else ' in evaluation mode'} on "
                          f"{cfg.model.task} input of shape {example.shape} failed: {first_line(err)}{hint}") from None


def first_line(err: BaseException) -> str:
    """`Type: the message's first line`, as one line of a refusal (SystemExit says its status)."""
    if isinstance(err, SystemExit):
        return f"SystemExit: it called sys.exit({err.code!r})"
    first = (str(err).strip().splitlines() or [""])[0][:300]
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def _with_traced_axis_names(cfg: Config, spec: ModelSpec) -> ModelSpec:
    """Add what tracing its training call on one example tells of a model of your own: the collective axis
    names the call needs but its layers do not show (a linen BatchNorm's axis_name behind the bridge), and how
    many stacks of layers it runs through `run_stack`. Any other failure is left to the output check, which
    reports it."""
    example = example_input(cfg)[0]
    params = nnx.to_pure_dict(spec.abstract)
    stacks: list[int] = []

    def count(run: RunStack, x: jax.Array, layers: Any) -> jax.Array:
        stacks.append(1)
        return run(x, layers)

    for _ in range(4):
        stacks.clear()
        try:
            with stack_runner(count):
                spec.trace_outputs(params, example)
            return replace(spec, stacks=len(stacks))
        except NameError as err:
            found = UNBOUND.search(str(err))
            if found is None or found.group(1) in spec.axis_names:
                return spec
            spec = replace(spec, axis_names=tuple(sorted({*spec.axis_names, found.group(1)})))
        except (Exception, SystemExit):  # noqa: BLE001 - the user's code: check_outputs reports it in one line
            return spec
    return spec


def shape_tree(spec: ModelSpec) -> dict[str, list[int]]:
    """Every parameter's and non-parameter variable's stored shape by its path ('params/dense/kernel',
    'model_state/bn/mean'): what a checkpoint of this model holds, as JSON."""
    flat = {("params", *map(str, p)): s for p, s in traverse_util.flatten_dict(spec.shapes).items()}
    flat |= {("model_state", *map(str, p)): s for p, s in traverse_util.flatten_dict(state_shapes(spec)).items()}
    return {"/".join(path): list(shape) for path, shape in flat.items()}


def state_shapes(spec: ModelSpec) -> Params:
    """The non-parameter variables' stored shapes, as a nested dict."""
    return jax.tree.map(lambda s: tuple(s.shape), spec.state_stored)



def param_axes(abstract_state: nnx.State) -> dict[str, Any]:
    """Nested dict (same structure as `nnx.to_pure_dict`) of each parameter's logical axes."""
    flat = {path: var.get_metadata().get("axes") for path, var in nnx.to_flat_state(abstract_state)}
    missing = [path for path, axes in flat.items() if axes is None]
    if missing:
        raise ValueError(f"parameters without logical axes: {missing}")
    return traverse_util.unflatten_dict(flat)


def param_shapes(abstract_state: nnx.State) -> dict[str, Any]:
    flat = {path: tuple(var.get_value().shape) for path, var in nnx.to_flat_state(abstract_state)}
    return traverse_util.unflatten_dict(flat)


