"""A model of your own with state besides its parameters, written as flax's docs and examples write one: the
examples (an nnx CNN with BatchNorm and Dropout taking `rngs`, a linen ResNet with BatchNorm through the bridge
taking `train`, an nnx MLP whose Dropout keeps its own stream) train under single, dp, fsdp (tp where their
names allow) on 8 devices with one device's losses and statistics, and resume exactly; evaluation runs in
evaluation mode; RNG streams advance; BatchNorm's statistics under shard_map and pmap; what cannot be done stops
with one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from shardbench.cli import main
from shardbench.devices import select_devices
from shardbench.errors import ConfigError
from shardbench.inspect import inspect
from shardbench.parallel.rules import make_layout
from shardbench.train.loop import run
from shardbench.optim import build_optimizer
from shardbench.models.spec import describe_model
from shardbench.train.state import init_state, state_shardings
from shardbench.validation import validate
from conftest import logged_losses as _losses

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _example(name: str) -> dict:
    return {"model.factory": f"{EXAMPLES / name}.py:build", "model.task": "classify", "data.augment": False}


def _final(out: Path) -> dict:
    """The last checkpoint of a run: its step, parameters and model state, as numpy."""
    steps = sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
    restored = ocp.StandardCheckpointer().restore((out / "checkpoints" / str(steps[-1]) / "default").absolute())
    return {"step": steps[-1], "params": restored["params"], "model_state": restored["model_state"]}


def _close(a: dict, b: dict, rel: float = 2e-5, abs_: float = 2e-6) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rel, atol=abs_)


CASES = [("cnn_batchnorm", ("dp", "fsdp", "tp")), ("linen_resnet", ("dp", "fsdp")),
         ("mlp_dropout", ("dp", "fsdp", "tp"))]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "strategies"), CASES, ids=[c[0] for c in CASES])
def test_examples_with_state_train_alike_and_resume_exactly(micro, tmp_path: Path, name: str,
                                                            strategies: tuple[str, ...]) -> None:
    """(cnn about 24 s, resnet 16 s, mlp 6 s on 2 cores.) BatchNorm statistics span the global batch under jit, so
    8 devices give one device's losses and statistics; the RNG streams are the same whole-batch draws."""
    base = {**_example(name), "train.checkpoint_every": 2}
    single = tmp_path / "single"
    run(micro(**base, **{"parallel.strategy": "single", "train.out": str(single)}))
    expected, final = _losses(single), _final(single)
    assert final["step"] == 4 and jax.tree.leaves(final["model_state"])
    counts = [v for k, v in jax.tree_util.tree_leaves_with_path(final["model_state"]) if "count" in str(k[-1])]
    stats = [v for k, v in jax.tree_util.tree_leaves_with_path(final["model_state"]) if "mean" in str(k[-1])]
    if name != "cnn_batchnorm":  # its dropout takes the step's key through `rngs`: no stream of its own
        # one draw a step on top of build's: mlp's Dropout forks its stream unused (0); the bridge's lazy_init drew 1
        assert counts and all(int(c) == {"mlp_dropout": 0, "linen_resnet": 1}[name] + 4 for c in counts), counts
    if name != "mlp_dropout":
        assert stats and all(np.abs(np.asarray(s)).sum() > 0 for s in stats)  # updated from zero by the steps
    for strategy in strategies:
        out = tmp_path / strategy
        run(micro(**base, **{"parallel.strategy": strategy, "parallel.mesh": "model=8" if strategy == "tp" else "8",
                             "parallel.devices": 8, "train.out": str(out)}))
        assert _losses(out) == pytest.approx(expected, rel=2e-5, abs=2e-6), strategy
        _close(_final(out)["model_state"], final["model_state"])
    # Resumed from step 2: the same losses, parameters and model state as the uninterrupted run.
    resumed = tmp_path / "resumed"
    shutil.copytree(single, resumed)
    shutil.rmtree(resumed / "checkpoints" / "4")
    (resumed / "summary.json").unlink()
    summary = run(micro(**base, **{"parallel.strategy": "single", "train.out": str(resumed), "train.resume": True}))
    assert summary["resumed_from"] == 2
    assert _losses(resumed)[-2:] == pytest.approx(expected[-2:], rel=1e-6, abs=1e-7)
    again = _final(resumed)
    _close(again["params"], final["params"], 1e-6, 1e-7)
    _close(again["model_state"], final["model_state"], 1e-6, 1e-7)


def _spec_and_state(micro, name: str):
    cfg = micro(**_example(name), **{"parallel.strategy": "single"})
    spec = describe_model(cfg)
    layout = make_layout("single", "none", select_devices(1))
    state = init_state(cfg, spec, layout, build_optimizer(cfg.optim, 10))
    return cfg, spec, state


@pytest.mark.parametrize("name", ["mlp_dropout", "linen_resnet", "cnn_batchnorm"])
def test_streams_advance_and_evaluation_is_deterministic(micro, name: str) -> None:
    """(about 2 s each.) Two training calls draw different masks (from the model's own stream, the bridge's,
    or the step's key through `rngs`); evaluation mode draws none and leaves BatchNorm's statistics alone."""
    _, spec, state = _spec_and_state(micro, name)
    x = jax.random.normal(jax.random.key(1), (4, 32, 32, 3))
    key1, key2 = jax.random.key(11), jax.random.key(12)
    train = jax.jit(lambda p, s, x, k: spec.apply(p, s, x, k, train=True))
    evaluate = jax.jit(lambda p, s, x, k: spec.apply(p, s, x, k, train=False))
    out1, after1 = train(state.params, state.model_state, x, key1)
    out2, after2 = train(state.params, after1, x, key1 if name != "cnn_batchnorm" else key2)
    assert not np.allclose(out1, out2)
    e1, kept = evaluate(state.params, after2, x, key1)
    e2, _ = evaluate(state.params, after2, x, key2)
    np.testing.assert_array_equal(e1, e2)
    _close(kept, after2, 0, 0)  # evaluation changes no variable
    if name == "cnn_batchnorm":  # evaluation normalises with the running statistics, training with the batch's
        assert not np.allclose(e1, train(state.params, after2, x, key1)[0], atol=1e-3)


BATCHNORM = '''
import jax.numpy as jnp
from flax import nnx


class Steps(nnx.Variable):
    """How many training calls the model has had: a Variable of the user's own."""


class Net(nnx.Module):
    def __init__(self, rngs):
        self.conv = nnx.Conv(3, 8, kernel_size=(3, 3), use_bias=False, rngs=rngs)
        self.norm = nnx.BatchNorm(8, momentum=0.5, rngs=rngs{axis})
        self.head = nnx.Linear(8, 10, rngs=rngs)
        self.steps = Steps(jnp.zeros((), jnp.int32))

    def __call__(self, x):
        if not self.norm.use_running_average:
            self.steps[...] += 1
        return self.head(nnx.relu(self.norm(self.conv(x))).mean(axis=(1, 2)))


def build(cfg, rngs):
    return Net(rngs)
'''


def _plugin(tmp_path: Path, name: str, source: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return f"{path}:build"


@pytest.mark.slow
def test_batchnorm_naming_an_axis_is_global_under_shard_map_and_pmap(micro, tmp_path: Path, capsys) -> None:
    """(about 5 s.) The data axis is bound under the name the BatchNorm gives, so 8 devices under shard_map
    and pmap give the losses and statistics of one device under jit; a Variable of the user's own counts."""
    plain = _plugin(tmp_path, "plain", BATCHNORM.replace("{axis}", ""))
    named = _plugin(tmp_path, "named", BATCHNORM.replace("{axis}", ", axis_name='batch'"))
    common = {"model.task": "classify", "data.augment": False, "train.checkpoint_every": 4}
    run(micro(**common, **{"model.factory": plain, "parallel.strategy": "single", "train.out": str(tmp_path / "1")}))
    expected, final = _losses(tmp_path / "1"), _final(tmp_path / "1")
    assert int(final["model_state"]["steps"]) == 4
    for spmd in ("shard_map", "pmap"):
        out = tmp_path / spmd
        capsys.readouterr()
        run(micro(**common, **{"model.factory": named, "parallel.strategy": "dp", "parallel.mesh": "8",
                               "parallel.devices": 8, "parallel.spmd": spmd, "train.out": str(out)}))
        assert "per shard" not in capsys.readouterr().out
        assert _losses(out) == pytest.approx(expected, rel=2e-5, abs=2e-6), spmd
        _close(_final(out)["model_state"], final["model_state"])
    # Naming none: per-shard statistics, and the run's first line says so.
    capsys.readouterr()
    run(micro(**common, **{"model.factory": plain, "parallel.strategy": "dp", "parallel.mesh": "8",
                           "parallel.devices": 8, "parallel.spmd": "shard_map", "train.out": str(tmp_path / "p")}))
    first = capsys.readouterr().out.splitlines()[0]
    assert "BatchNorm statistics per shard" in first and "its 4 examples" in first


def test_an_axis_name_nothing_binds_under_jit_stops_with_one_line(tmp_path: Path, capsys) -> None:
    """(under 2 s.) nnx's axis_name is read from the layers; linen's behind the bridge is found by tracing."""
    linen = '''
import flax.linen as nn
import jax.numpy as jnp
from flax import nnx

mode_argument = "train"


class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.BatchNorm(use_running_average=not train, axis_name='batch')(nn.Conv(4, (3, 3))(x))
        return nn.Dense(10)(x.mean(axis=(1, 2)))


def build(cfg, rngs):
    model = nnx.bridge.ToNNX(Net(), rngs=rngs)
    nnx.bridge.lazy_init(model, jnp.zeros((1, 32, 32, 3)), train=False)
    return model
'''
    for name, source in (("nnx", BATCHNORM.replace("{axis}", ", axis_name='batch'")), ("linen", linen)):
        out = tmp_path / name
        code = main(["train", "--model", _plugin(tmp_path, name, source), "--task", "classify", "--data", "synthetic",
                     "--steps", "2", "--out", str(out), "--data.cache-dir", str(tmp_path / "cache")])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1, err
        assert "names the collective axis 'batch', which --spmd jit does not bind: use --spmd shard_map or pmap" in err
        assert not out.exists()


NAMED_STAT = '''
import jax.numpy as jnp
from flax import nnx


class Net(nnx.Module):
    def __init__(self, rngs):
        self.up = nnx.Linear(32 * 32 * 3, 64, kernel_init=nnx.with_partitioning(nnx.initializers.lecun_normal(),
                             ('embed', 'mlp')), rngs=rngs)
        self.head = nnx.Linear(64, 10, rngs=rngs)
        self.peak = nnx.BatchStat(jnp.zeros((64,)), sharding_names=('mlp',))

    def __call__(self, x):
        h = nnx.relu(self.up(x.reshape(x.shape[0], -1)))
        self.peak[...] = jnp.maximum(self.peak[...], h.max(axis=0))
        return self.head(h)


def build(cfg, rngs):
    return Net(rngs)
'''


def test_model_state_is_placed_by_its_names_and_counted_in_inspect(micro, tmp_path: Path) -> None:
    """(under 2 s.) Unnamed state is replicated; a variable whose metadata names 'mlp' is split like the
    parameters that name it; inspect lists the model state and its bytes per device."""
    cfg = micro(**{"model.factory": _plugin(tmp_path, "named_stat", NAMED_STAT), "model.task": "classify",
                   "parallel.strategy": "tp", "parallel.mesh": "model=8", "parallel.devices": 8})
    spec = describe_model(cfg)
    layout = make_layout("tp", "model=8", select_devices(8))
    shardings = state_shardings(spec, layout, build_optimizer(cfg.optim, 10))
    assert spec.state_axes["peak"] == ("mlp",)
    assert tuple(shardings.model_state["peak"].spec) == ("model",)
    text = inspect(cfg)
    assert "model state (BatchStat)" in text and "peak  BatchStat  (64,) float32  per device (8,)  32 bytes" in text
    assert "model state: 32 bytes per device" in text
    cnn = inspect(micro(**_example("cnn_batchnorm"), **{"parallel.strategy": "dp", "parallel.mesh": "8",
                                                        "parallel.devices": 8}))
    assert "batch_norm1/mean  BatchStat  (32,) float32  per device (32,)" in cnn


REFUSED = [
    ('''
from flax import nnx


class Net(nnx.Module):
    def __init__(self, rngs):
        self.head = nnx.Linear(32 * 32 * 3, 10, rngs=rngs)
        self.activation = nnx.Variable("relu")

    def __call__(self, x):
        return self.head(x.reshape(x.shape[0], -1))


def build(cfg, rngs):
    return Net(rngs)
''', "the Variable activation holds a str, not an array: store jnp.asarray(...)"),
    ('''
import flax.linen as nn
import jax.numpy as jnp
from flax import nnx


class Net(nnx.Module):
    def __init__(self, rngs):
        self.body = nnx.bridge.ToNNX(nn.BatchNorm(use_running_average=False), rngs=rngs)
        nnx.bridge.lazy_init(self.body, jnp.zeros((1, 32, 32, 3)))
        self.head = nnx.Linear(3, 10, rngs=rngs)

    def __call__(self, x):
        return self.head(self.body(x).mean(axis=(1, 2)))


def build(cfg, rngs):
    return Net(rngs)
''', "the linen module at body keeps BatchStat (batch_stats) that only a top-level bridge updates: return the ToNNX"),
    ('''
from flax import nnx

mode_argument = "is_test"


class Net(nnx.Module):
    def __init__(self, rngs):
        self.head = nnx.Linear(32 * 32 * 3, 10, rngs=rngs)

    def __call__(self, x, is_test=False):
        return self.head(x.reshape(x.shape[0], -1))


def build(cfg, rngs):
    return Net(rngs)
''', "unknown mode argument 'is_test': name one True in training"),
    # linen's BatchNorm with its `train` default and no mode_argument: evaluation would update batch_stats.
    ('''
import flax.linen as nn
import jax.numpy as jnp
from flax import nnx


class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.BatchNorm(use_running_average=not train)(nn.Dense(16)(x.reshape(x.shape[0], -1)))
        return nn.Dense(10)(x)


def build(cfg, rngs):
    return nnx.bridge.ToNNX(Net(), rngs=rngs).lazy_init(jnp.zeros((1, 32, 32, 3)))
''', "the linen module updates batch_stats but declares no mode argument, so evaluation would run it in training "
        "mode: add mode_argument = \"train\" (or \"deterministic\", ...) to "),
    # A model that only evaluation's call breaks: found by tracing that call too, before compiling.
    ('''
from flax import nnx


class Net(nnx.Module):
    def __init__(self, rngs):
        self.head = nnx.Linear(32 * 32 * 3, 10, rngs=rngs)

    def __call__(self, x, train: bool = False):
        if not train:
            raise ValueError("no evaluation path")
        return self.head(x.reshape(x.shape[0], -1))


def build(cfg, rngs):
    return Net(rngs)
''', "calling it in evaluation mode on classify input of shape (2, 32, 32, 3) failed: ValueError: no evaluation path"),
    ('''
import flax.linen as nn
from flax import nnx


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(x.reshape(x.shape[0], -1))


def build(cfg, rngs):
    return nnx.bridge.ToNNX(Net(), rngs=rngs)  # no lazy_init: no parameters yet
''', "the linen module through nnx.bridge.ToNNX has no parameters: call nnx.bridge.lazy_init(model, example_input) "
     "in build, as examples/linen_mlp.py does"),
]


@pytest.mark.parametrize(("source", "message"), REFUSED, ids=["not-an-array", "nested-bridge", "unknown-mode",
                                                              "linen-batchnorm-without-mode", "eval-only-failure",
                                                              "bridge-without-lazy-init"])
def test_what_cannot_be_carried_stops_with_one_line(tmp_path: Path, capsys, source: str, message: str) -> None:
    """(under 1 s each.)"""
    out = tmp_path / "run"
    code = main(["train", "--model", _plugin(tmp_path, "mine", source), "--task", "classify", "--data", "synthetic",
                 "--steps", "2", "--out", str(out), "--data.cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not out.exists()


def test_a_mode_argument_is_passed_by_flag_or_found_in_an_nnx_signature(micro, tmp_path: Path) -> None:
    """(about 1 s.) A linen module's `deterministic` through the bridge, named by `--model.mode-argument`, gets
    True in evaluation and False in training; an nnx module's own `train` parameter is found by its name."""
    linen = '''
import flax.linen as nn
import jax.numpy as jnp
from flax import nnx


class Net(nn.Module):
    @nn.compact
    def __call__(self, x, deterministic: bool):
        return nn.Dense(10)(x.reshape(x.shape[0], -1)) * (1.0 if deterministic else 2.0)


def build(cfg, rngs):
    model = nnx.bridge.ToNNX(Net(), rngs=rngs)
    nnx.bridge.lazy_init(model, jnp.zeros((1, 32, 32, 3)), deterministic=True)
    return model
'''
    factory = _plugin(tmp_path, "flagged", linen)
    assert describe_model(micro(**{"model.factory": factory, "model.task": "classify"})).mode is None
    cfg = micro(**{"model.factory": factory, "model.task": "classify", "model.mode_argument": "deterministic"})
    spec = describe_model(cfg)
    assert spec.mode == ("deterministic", False)
    params = jax.tree.map(jnp.ones_like, nnx.to_pure_dict(spec.abstract))
    held = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), spec.state_stored)  # the bridge's stream
    x = jnp.ones((2, 32, 32, 3))
    trained = spec.apply(params, held, x, None, train=True)[0]
    evaluated = spec.apply(params, held, x, None, train=False)[0]
    np.testing.assert_allclose(trained, 2 * evaluated)
    with pytest.raises(ConfigError, match="a model of your own"):
        validate(micro(**{"model.mode_argument": "train"}))
    own = _plugin(tmp_path, "own", '''
from flax import nnx


class Net(nnx.Module):
    def __init__(self, rngs):
        self.head = nnx.Linear(32 * 32 * 3, 10, rngs=rngs)

    def __call__(self, x, train: bool = False):
        return self.head(x.reshape(x.shape[0], -1))


def build(cfg, rngs):
    return Net(rngs)
''')
    assert describe_model(micro(**{"model.factory": own, "model.task": "classify"})).mode == ("train", True)
