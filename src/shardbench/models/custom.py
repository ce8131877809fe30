"""Your own model: a flax nnx module that a function of yours builds, named on the command line.

    shardbench train --model my_model.py:build --task classify --data synthetic --strategy fsdp --devices 8

`--model FILE.py:NAME` loads a file, `--model package.module:NAME` imports a module; `NAME(cfg, rngs)` gets the
run's Config and an `nnx.Rngs` and returns an `nnx.Module` whose `__call__(inputs)` (or `__call__(inputs,
rng=key)`, to draw dropout masks from the step's key) returns what the task scores: logits (batch, classes) for
`classify`, logits (batch, positions, vocabulary) for `next-token`, values (batch, outputs) for `regress`.

Parameters name their dimensions through flax's own sharding metadata (`nnx.with_partitioning(init, ('embed',
'mlp'))`, or `out_sharding=` / `sharding_names=` on an `nnx.Param`). The conventional names (batch, embed, mlp,
heads, kv, vocab, classes, layers, ...) and their common aliases map onto shardbench's logical axes, whose
placement each strategy's table decides; `--rules NAME=AXIS` maps any other name onto one of them. A name no
table maps is kept whole (FSDP may still shard such a parameter along a dimension that divides), and the run's
header says which names those were.

Training state beyond the parameters: every other `nnx.Variable` the module holds (`nnx.BatchStat`, linen's
`batch_stats` through the bridge, a Variable subclass of your own) is carried by the step as the module updates
it, checkpointed, and replicated unless its metadata names axes; RNG streams the module keeps (`nnx.Dropout(rate,
rngs=rngs)`, the bridge's) are carried too, so they advance every step. Modes: the module is switched with
`model.train()` for the step and `model.eval()` for evaluation; a `__call__(inputs, rngs=...)` gets an
`nnx.Rngs` built from the step's key; a module whose `__call__` takes a mode flag (linen's `train=` or
`deterministic=`) declares it with `mode_argument = "train"` in its file (or `--model.mode-argument`); an nnx
module's own `__call__` parameter of such a name is found without it.

Optional functions in the same file: `loss(outputs, batch)` returns the per-example loss (summed over an
example's targets) in place of the task's own; `flops_per_example(cfg)` returns the training FLOPs of one
example (forward + backward) for MFU. Without it, FLOPs are counted from the model's forward and backward traced
on one device, unsharded (docs/own-model.md, "Its loss and FLOPs").
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flax import nnx
from flax import traverse_util

from shardbench.config import Config
from shardbench.errors import ConfigError
from shardbench.models import axes as names

SPEC_HINT = "FILE.py:FUNCTION or package.module:FUNCTION"
# Where flax keeps a parameter's logical names, across its versions; shardbench's own models use "axes".
METADATA_KEYS = ("axes", "out_sharding", "sharding_names", "sharding")
KNOWN = frozenset({names.BATCH, names.SEQ, names.EMBED, names.MLP, names.HEADS, names.KV, names.LAYERS,
                   names.NORM, names.CLASSES, names.PATCH, names.VOCAB, names.FEATURES, names.EXPERT})
ALIASES: dict[str, str] = {
    "joined_kv": names.HEADS, "q_heads": names.HEADS, "kv_heads": names.HEADS, "num_heads": names.HEADS,
    "hidden": names.MLP, "ffn": names.MLP, "intermediate": names.MLP, "mlp_dim": names.MLP,
    "model": names.EMBED, "d_model": names.EMBED, "width": names.EMBED,
    "head_dim": names.KV, "vocabulary": names.VOCAB, "num_classes": names.CLASSES, "labels": names.CLASSES,
    "layer": names.LAYERS, "stage": names.LAYERS, "length": names.SEQ, "sequence": names.SEQ,
}


@dataclass(frozen=True)
class Plugin:
    """What a `--model` file or module gives: its builder and its optional overrides."""

    source: str
    build: Callable[[Config, nnx.Rngs], Any]
    loss: Callable[[Any, Any], Any] | None
    flops_per_example: Callable[[Config], float] | None
    mode_argument: str = ""  # the file's `mode_argument`: the keyword of __call__ that says train or evaluate
    file: str = ""  # the file the function was loaded from ('' where Python knows none)


def _load_module(spec: str, target: str) -> Any:
    if target.endswith(".py") or "/" in target:
        path = Path(target).expanduser()
        if not path.is_file():
            raise ConfigError(f"--model {spec}: {path} is not a file; give {SPEC_HINT}")
        name = f"shardbench_user_model_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]}"
        found = importlib.util.spec_from_file_location(name, path)
        if found is None or found.loader is None:
            raise ConfigError(f"--model {spec}: {path} cannot be loaded as Python")
        module = importlib.util.module_from_spec(found)
        sys.modules[name] = module
        found.loader.exec_module(module)
        return module
    return importlib.import_module(target)


@functools.lru_cache(maxsize=16)
def load(spec: str) -> Plugin:
    """The plug-in `--model` names, or a one-line ConfigError (bad spec, a file that does not import, no such
    function, a function that does not take (cfg, rngs))."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise ConfigError(f"--model '{spec}' names no function: give {SPEC_HINT}")
    try:
        module = _load_module(spec, target)
    except ConfigError:
        raise
    except BaseException as err:  # noqa: BLE001 - any failure of the user's code is reported in one line
        first = (str(err).strip().splitlines() or [""])[0]
        raise ConfigError(f"--model {spec}: {target} does not import: {type(err).__name__}: {first}") from None
    build = getattr(module, name, None)
    if not callable(build):
        offered = sorted(n for n, v in vars(module).items()  # its own functions, not those it imported
                         if inspect.isfunction(v) and not n.startswith("_") and v.__module__ == module.__name__)
        raise ConfigError(f"--model {spec}: {target} has no function {name} (it has: {', '.join(offered) or 'none'})")
    try:
        inspect.signature(build).bind(object(), object())
    except TypeError:
        raise ConfigError(f"--model {spec}: {name}{inspect.signature(build)} must take (cfg, rngs): the run's "
                          f"Config and an nnx.Rngs") from None
    except ValueError:
        pass  # no signature to read (a builtin): calling it will tell
    loss, flops = getattr(module, "loss", None), getattr(module, "flops_per_example", None)
    mode = getattr(module, "mode_argument", "")
    if not isinstance(mode, str):
        raise ConfigError(f"--model {spec}: mode_argument = {mode!r} in {target} must be a keyword's name, e.g. "
                          f"'train' or 'deterministic'")
    return Plugin(spec, build, loss if callable(loss) else None, flops if callable(flops) else None, mode,
                  str(getattr(module, "__file__", None) or ""))


def source_digest(spec: str) -> str:
    """sha256 of the file `--model` loads its function from ('' where there is no file), read now: what a
    resumed run compares to know its model's code is the code it was trained with."""
    file = load(spec).file
    if not file or not Path(file).is_file():
        return ""
    return hashlib.sha256(Path(file).read_bytes()).hexdigest()


def build(cfg: Config, rngs: nnx.Rngs) -> nnx.Module:
    """The user's module. Flax's eager sharding stays off: shardbench places every array itself."""
    plugin = load(cfg.model.factory)
    with nnx.use_eager_sharding(False):
        module = plugin.build(cfg, rngs)
    if not isinstance(module, nnx.Module):
        what = "an array" if hasattr(module, "shape") and hasattr(module, "dtype") else f"a {type(module).__name__}"
        raise ConfigError(f"--model {plugin.source} returned {what}, not an nnx.Module (a linen "
                          f"module can be wrapped with flax.nnx.bridge.ToNNX)")
    return module


def _call_parameters(module: nnx.Module) -> Mapping[str, inspect.Parameter]:
    try:
        return inspect.signature(type(module).__call__).parameters
    except (TypeError, ValueError):
        return {}


def takes_rng(module: nnx.Module) -> bool:
    """Whether the module's __call__ takes the step's key as `rng`."""
    return "rng" in _call_parameters(module)


def takes_rngs(module: nnx.Module) -> bool:
    """Whether the module's __call__ takes an `nnx.Rngs` as `rngs` (flax's NNX idiom). The linen bridge's
    `rngs` replaces the streams it keeps, which shardbench carries and advances instead, so it gets none."""
    return "rngs" in _call_parameters(module) and not isinstance(module, nnx.bridge.ToNNX)


# A mode keyword's value in training: True for these, False for the evaluation-named ones.
TRAIN_TRUE = frozenset({"train", "training", "is_training"})
EVAL_TRUE = frozenset({"deterministic", "eval", "evaluate", "is_eval", "inference", "use_running_average"})


def mode_argument(cfg: Config, module: nnx.Module) -> tuple[str, bool] | None:
    """The keyword that tells the module's __call__ train or evaluate, and its value in training: from
    `--model.mode-argument`, else the model file's `mode_argument`, else an nnx module's own `__call__`
    parameter of a known name (`train`, `deterministic`, ...); None when there is none."""
    name = cfg.model.mode_argument or load(cfg.model.factory).mode_argument
    if not name and not isinstance(module, nnx.bridge.ToNNX):
        name = next((p for p in _call_parameters(module) if p in TRAIN_TRUE | EVAL_TRUE), "")
    if not name:
        return None
    if name not in TRAIN_TRUE | EVAL_TRUE:
        raise ConfigError(f"--model {cfg.model.factory}: unknown mode argument '{name}': name one True in training "
                          f"({', '.join(sorted(TRAIN_TRUE))}) or in evaluation ({', '.join(sorted(EVAL_TRUE))})")
    params = _call_parameters(module)
    bridged = isinstance(module, nnx.bridge.ToNNX)  # a linen module's keywords pass through the wrapper
    if not bridged and params and name not in params and not any(
            p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        raise ConfigError(f"--model {cfg.model.factory}: mode argument '{name}' is not a parameter of "
                          f"{type(module).__name__}.__call__: name one it takes, or none")
    return name, name in TRAIN_TRUE


def axis_names(module: nnx.Module) -> tuple[str, ...]:
    """The collective axis names the module's layers name (`nnx.BatchNorm(axis_name=...)`), sorted."""
    found: set[str] = set()
    for _, sub in nnx.iter_modules(module):
        given = getattr(sub, "axis_name", None)
        for name in (given if isinstance(given, (tuple, list)) else (given,)):
            if isinstance(name, str):
                found.add(name)
    return tuple(sorted(found))


def bridge_collections(cfg: Config, model: nnx.Module) -> tuple[str, ...]:
    """A linen module through the bridge: the collections besides its parameters that its call updates
    (`batch_stats`), which the bridge keeps only when asked for them. One the bridge holds deeper inside an
    nnx module cannot be asked for; that is refused naming it."""
    bridges = [(path, m) for path, m in nnx.iter_modules(model) if isinstance(m, nnx.bridge.ToNNX)]
    found: list[str] = []
    for path, bridge in bridges:
        _, _, _, held = nnx.split(bridge, nnx.Param, nnx.RngState, ...)
        names = linen_collections(held)
        cols = sorted({type(v).__name__ for _, v in nnx.to_flat_state(held)})
        if not cols:
            continue
        if path:
            raise ConfigError(
                f"--model {cfg.model.factory}: the linen module at {'/'.join(map(str, path))} keeps {', '.join(cols)} "
                f"({', '.join(names)}) that only a top-level bridge updates: return the ToNNX from build, or use nnx")
        found.extend(linen_collections(held))
    return tuple(sorted(set(found)))


def uninitialised_bridges(model: nnx.Module) -> list[str]:
    """Where `model` holds a linen module through the bridge with no parameters yet ('' for `model` itself):
    `nnx.bridge.ToNNX` makes them only when `nnx.bridge.lazy_init` calls it once."""
    return ["/".join(map(str, path)) for path, m in nnx.iter_modules(model)
            if isinstance(m, nnx.bridge.ToNNX) and not nnx.to_flat_state(nnx.state(m, nnx.Param))]


def linen_collections(held: nnx.State) -> list[str]:
    """The linen collection names of the bridge's non-parameter variables (BatchStat -> 'batch_stats')."""
    from flax.nnx import variablelib

    return sorted({variablelib.variable_name_from_type(type(v), allow_register=True)
                   for _, v in nnx.to_flat_state(held)})


def parse_rules(text: str) -> dict[str, str]:
    """'conv_out=mlp,stage=layers' -> {'conv_out': 'mlp', 'stage': 'layers'}; AXIS is a logical axis or 'none'."""
    rules: dict[str, str] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, sep, axis = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--rules '{item}' is not NAME=AXIS, e.g. conv_out=mlp")
        axis = axis.strip()
        if axis not in KNOWN and axis != "none":
            raise ConfigError(f"--rules {item}: {axis} is not one of shardbench's logical axes: choose from "
                              f"{', '.join(sorted(KNOWN))} or none")
        name = name.strip()
        if rules.get(name, axis) != axis:
            raise ConfigError(f"--rules maps {name} twice, to {rules[name]} and to {axis}: give {name} one axis")
        rules[name] = axis
    return rules


def logical_axes(abstract: nnx.State, rules: Mapping[str, str]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Each parameter's dimensions as shardbench's logical axes (None = kept whole by every table), as a nested
    dict like `nnx.to_pure_dict`, and the names that no table maps (sorted)."""
    flat, unmapped = {}, set()
    for path, var in nnx.to_flat_state(abstract):
        meta = var.get_metadata()
        given = next((meta[k] for k in METADATA_KEYS if meta.get(k)), None)
        shape = tuple(var.get_value().shape)
        ndim = len(shape)
        if given is None:
            flat[path] = (None,) * ndim
            continue
        if len(tuple(given)) != ndim:  # flax would refuse it only once a mesh is used; it was dropped unsaid
            raise ConfigError(f"your model's parameter {'/'.join(map(str, path))} names {len(tuple(given))} axes "
                              f"{tuple(given)} for its {ndim} dimensions {shape}: give one name per dimension "
                              f"(None for one kept whole)")
        axes = []
        for name in tuple(given):
            mapped = _map(name, rules)
            if name is not None and mapped is None and rules.get(str(name)) != "none":
                unmapped.add(str(name))
            axes.append(mapped)
        flat[path] = tuple(axes)
    return traverse_util.unflatten_dict(flat), tuple(sorted(unmapped))


def declared_names(*states: nnx.State) -> set[str]:
    """Every axis name the variables' metadata give (sharding_names, sharding or names)."""
    found: set[str] = set()
    for state in states:
        for _, var in nnx.to_flat_state(state):
            meta = var.get_metadata()
            given = next((meta[k] for k in METADATA_KEYS if meta.get(k)), None) or ()
            found.update(str(name) for name in tuple(given) if isinstance(name, str))
    return found


def _map(name: Any, rules: Mapping[str, str]) -> str | None:
    if name is None or not isinstance(name, str):
        return None
    if name in rules:
        return None if rules[name] == "none" else rules[name]
    if name in KNOWN:
        return name
    return ALIASES.get(name)
