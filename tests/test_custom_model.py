"""A model of your own: the examples (a ConvNet and a Transformer LM written the way flax's examples write
models, and a linen MLP through flax's nnx bridge) under dp, fsdp and tp on 8 devices give one device's losses; axis names come from flax's sharding
metadata, unknown ones are kept whole and named, --rules maps them; bad plug-ins stop with one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardbench import config as config_lib
from shardbench.cli import main
from shardbench.devices import select_devices
from shardbench.errors import ConfigError
from shardbench.parallel.rules import make_layout
from shardbench.parsing import override
from shardbench.train.loop import run
from shardbench.preflight import check_runnable
from shardbench.models.spec import describe_model
from conftest import logged_losses as _losses

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CONVNET = {"model.factory": f"{EXAMPLES / 'convnet.py'}:build", "model.task": "classify"}
TRANSFORMER = {"model.factory": f"{EXAMPLES / 'transformer.py'}:build", "model.task": "next-token",
               "data.dataset": "tokens-uniform", "model.vocab_size": 64, "model.seq_len": 16, "model.embed_dim": 32,
               "model.num_heads": 8, "model.mlp_dim": 64, "model.num_layers": 2}


def _cfg(micro, model: dict, **extra: object) -> config_lib.Config:
    return micro(**{**model, "data.augment": False, **extra})


LINEN = {"model.factory": f"{EXAMPLES / 'linen_mlp.py'}:build", "model.task": "classify"}


@pytest.mark.slow
@pytest.mark.parametrize("model", [CONVNET, TRANSFORMER, LINEN], ids=["convnet", "transformer", "linen-bridge"])
def test_examples_train_alike_under_every_strategy(micro, tmp_path: Path, model: dict) -> None:
    single = _cfg(micro, model, **{"parallel.strategy": "single", "train.out": str(tmp_path / "single")})
    flops = run(single)["measurements"]["flops"]
    expected = _losses(tmp_path / "single")
    assert len(expected) == 4
    # The transformer and the linen MLP have no flops_per_example: their FLOPs are XLA's count of the model on one
    # device, the same under every layout (the compiled step's count x devices counted tp's replicated work 8
    # times), so MFU ranks the layouts exactly as their step times do.
    own_count = model is not CONVNET
    assert flops["mfu_uses"] == ("traced" if own_count else "analytic")
    assert (flops["traced_per_step"] is not None) == own_count
    for strategy, mesh in (("dp", "8"), ("fsdp", "8"), ("tp", "model=8")):
        cfg = _cfg(micro, model, **{"parallel.strategy": strategy, "parallel.mesh": mesh, "parallel.devices": 8,
                                    "train.out": str(tmp_path / strategy)})
        summary = run(cfg)
        m = summary["measurements"]
        assert _losses(tmp_path / strategy) == pytest.approx(expected, rel=2e-5, abs=2e-6), strategy
        assert summary["strategy"] == strategy and m["mfu"]["mfu"] is not None
        assert m["flops"]["traced_per_step"] == flops["traced_per_step"] and m["flops"]["mfu_uses"] == flops["mfu_uses"]
        counted = flops["traced_per_step"] or flops["analytic_per_step"]
        assert m["mfu"]["mfu"] * m["step_time_s"]["median"] * m["mfu"]["peak_flops_per_s_per_device"] * 8 == (
            pytest.approx(counted, rel=1e-9))
        if model is TRANSFORMER:  # throughput of a next-token model of your own counts tokens
            assert summary["measurements"]["throughput"]["unit"] == "tokens"


def test_the_one_device_count_is_had_where_the_backend_cannot_analyse_an_uncompiled_program(
        micro, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An accelerator's plugin (CUDA's, TPU's: the PJRT C API) gives no cost analysis of a lowered program, which
    made the count None on every GPU, and MFU fell back to the compiled step's count x devices. Made so here for
    every backend, the count comes from the one-device program compiled instead: within 2% of the lowered one
    (XLA's optimisations)."""
    import jax._src.xla_bridge as xla_bridge
    from shardbench.models.spec import example_input

    cfg = _cfg(micro, {"model.factory": _plugin(tmp_path, LINEAR), "model.task": "classify"})
    example, _, _ = example_input(cfg, rows=16)
    spec = describe_model(cfg)
    lowered = spec.traced_train_flops(example)
    monkeypatch.setattr(xla_bridge, "using_pjrt_c_api", lambda backend=None: True)
    compiled = spec.traced_train_flops(example)
    assert lowered is not None and compiled is not None and abs(compiled - lowered) <= 0.02 * lowered


def test_a_note_says_when_tp_splits_nothing_and_a_rule_names_nothing(micro, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A Linear whose kernel names no axes, under tp on 8 devices: tp splits none of its parameters, which a note
    says (it ran as 8 copies, saying only "tp on mesh 1x8"), in train's first lines and in inspect's (which said
    nothing); --rules foo=mlp names an axis no variable of the model names, said too. Under dp, or with its axes
    named (the convnet), neither is said."""
    from shardbench.cli import main
    from shardbench.parallel.checks import layout_notes
    from shardbench.preflight import check_run
    from shardbench.train.console import header_line

    tp = {"parallel.strategy": "tp", "parallel.mesh": "model=8", "parallel.devices": 8,
          "train.out": str(tmp_path / "o")}
    bare = {"model.factory": _plugin(tmp_path, LINEAR), "model.task": "classify"}
    checked = check_run(_cfg(micro, bare, **tp, **{"parallel.rules": "foo=mlp"}))
    note = ("tp splits none of this model's parameters over the model axis: none names an axis its table maps "
            "(name them with nnx.with_partitioning, or map yours with --rules NAME=AXIS)")
    assert layout_notes(checked.spec, checked.layout, "model=8") == [note]
    assert "| --rules names what no variable of this model names, so it does nothing: foo" in header_line(checked)
    assert main(["inspect", "--model", bare["model.factory"], "--task", "classify", "--strategy", "tp", "--mesh",
                 "model=8", "--devices", "8"]) == 0
    assert f"note: {note}" in capsys.readouterr().out
    for cfg in (_cfg(micro, bare, **{**tp, "parallel.strategy": "dp", "parallel.mesh": "8"}), _cfg(micro, CONVNET, **tp)):
        checked = check_run(cfg)
        assert not layout_notes(checked.spec, checked.layout, cfg.parallel.mesh)
        assert "--rules names" not in header_line(checked)


def test_inspect_says_what_the_first_line_says_of_the_models_axis_names(micro) -> None:
    """inspect, where one goes to learn what to give --rules, names the convnet's axes no table maps (conv_in,
    conv_out, kept whole) and a --rules name no variable gives, as train's first line does (it said neither)."""
    from shardbench.inspect import inspect

    cfg = _cfg(micro, CONVNET, **{"parallel.strategy": "tp", "parallel.mesh": "1x8", "parallel.devices": 8,
                                  "parallel.rules": "hiden=mlp"})
    head = inspect(cfg).split("\n\n", 1)[0].splitlines()
    assert head[1:] == ["note: axes no table maps, kept whole: conv_in, conv_out (map one with --rules NAME=AXIS)",
                        "note: --rules names what no variable of this model names, so it does nothing: hiden"]


def test_a_model_of_your_owns_flops_are_counted_on_one_device_as_a_hand_count_says(micro, tmp_path: Path) -> None:
    """One Linear of 3,072 inputs and 10 outputs on 16 examples: its forward (2 x 16 x 3,072 x 10) and its
    weights' gradient (the same again; no input gradient is needed) are 1,966,080 matmul FLOPs. XLA's count of the
    one-device program adds the bias, the loss's sum and their gradients (3 x 16 x 10 and a few): within 0.1%."""
    cfg = _cfg(micro, {"model.factory": _plugin(tmp_path, LINEAR), "model.task": "classify"})
    from shardbench.models.spec import example_input

    example, _, _ = example_input(cfg, rows=16)
    traced = describe_model(cfg).traced_train_flops(example)
    matmuls = 2 * (2 * 16 * 3072 * 10)
    assert traced is not None and matmuls <= traced <= matmuls * 1.001


def test_axis_names_come_from_flax_metadata_and_rules_map_the_rest(micro) -> None:
    cfg = _cfg(micro, CONVNET)
    spec = describe_model(cfg)
    assert spec.axes["linear1"]["kernel"] == ("embed", "mlp") and spec.axes["linear2"]["kernel"] == ("mlp", "classes")
    assert spec.axes["conv1"]["kernel"] == (None, None, None, None) and spec.unmapped == ("conv_in", "conv_out")
    assert spec.axes["conv1"]["bias"] == (None,)  # no names given: whole
    layout = make_layout("tp", "model=8", select_devices(8))
    assert tuple(layout.param_spec(spec.axes["linear1"]["kernel"], (4096, 256))) == (None, "model")
    mapped = describe_model(override(cfg, {"parallel.rules": "conv_out=mlp,conv_in=none"}))
    assert mapped.axes["conv2"]["kernel"] == (None, None, None, "mlp") and mapped.unmapped == ()
    with pytest.raises(ConfigError, match="--rules conv_out=model: model is not one of shardbench's logical axes"):
        describe_model(override(cfg, {"parallel.rules": "conv_out=model"}))
    with pytest.raises(ConfigError, match="^--rules maps conv_out twice, to mlp and to none: give conv_out one axis$"):
        describe_model(override(cfg, {"parallel.rules": "conv_out=mlp,conv_in=none,conv_out=none"}))
    repeated = describe_model(override(cfg, {"parallel.rules": "conv_out=mlp,conv_out=mlp"}))  # the same, twice
    assert repeated.axes["conv2"]["kernel"] == (None, None, None, "mlp")


def _plugin(tmp_path: Path, source: str) -> str:
    path = tmp_path / "mine.py"
    path.write_text(source)
    return f"{path}:build"


LINEAR = ("import optax\nfrom flax import nnx\n"
          "class Linear(nnx.Module):\n"
          "    def __init__(self, rngs):\n"
          "        self.dense = nnx.Linear(32 * 32 * 3, 10, rngs=rngs)\n"
          "    def __call__(self, x):\n"
          "        return self.dense(x.reshape(x.shape[0], -1))\n"
          "def build(cfg, rngs):\n    return Linear(rngs)\n")

BAD_PLUGINS = [
    ("def build(cfg, rngs)\n    return None\n", "does not import: SyntaxError"),
    ("import not_a_module_anywhere\n", "does not import: ModuleNotFoundError"),
    ("def build(cfg):\n    return None\n", "build(cfg) must take (cfg, rngs)"),
    ("def make(cfg, rngs):\n    return None\n", "has no function build (it has: make)"),
    # the functions it offers are the file's own, not those it imported
    ("from math import sqrt\nfrom flax.nnx import with_partitioning as P\ndef make(cfg, rngs):\n    return None\n",
     "has no function build (it has: make)"),
    # a parameter naming fewer axes than it has dimensions: its names were dropped, and nothing said so
    ("from flax import nnx\n"
     "class Short(nnx.Module):\n"
     "    def __init__(self, rngs):\n"
     "        init = nnx.with_partitioning(nnx.initializers.lecun_normal(), ('embed',))\n"
     "        self.dense = nnx.Linear(32 * 32 * 3, 10, kernel_init=init, rngs=rngs)\n"
     "    def __call__(self, x):\n"
     "        return self.dense(x.reshape(x.shape[0], -1))\n"
     "def build(cfg, rngs):\n    return Short(rngs)\n",
     "your model's parameter dense/kernel names 1 axes ('embed',) for its 2 dimensions (3072, 10): give one name "
     "per dimension (None for one kept whole)"),
    ("def build(cfg, rngs):\n    return 3\n", "returned a int, not an nnx.Module"),
    # an array, traced: not "returned a DynamicJaxprTracer"
    ("import jax.numpy as jnp\ndef build(cfg, rngs):\n    return jnp.zeros((3,))\n",
     "returned an array, not an nnx.Module"),
    ("from flax import nnx\n"
     "class Wrong(nnx.Module):\n"
     "    def __init__(self, rngs):\n"
     "        self.dense = nnx.Linear(32 * 32 * 3, 7, rngs=rngs)\n"
     "    def __call__(self, x):\n"
     "        return self.dense(x.reshape(x.shape[0], -1))\n"
     "def build(cfg, rngs):\n    return Wrong(rngs)\n",
     "returned shape (2, 7) for input (2, 32, 32, 3); --task classify scores logits (batch, --model.num-classes)"),
    # Several outputs: said as what came back, not as "shape None".
    ("from flax import nnx\n"
     "class Two(nnx.Module):\n"
     "    def __init__(self, rngs):\n"
     "        self.dense = nnx.Linear(32 * 32 * 3, 10, rngs=rngs)\n"
     "    def __call__(self, x):\n"
     "        y = self.dense(x.reshape(x.shape[0], -1))\n"
     "        return {'logits': y, 'aux': y.sum()}\n"
     "def build(cfg, rngs):\n    return Two(rngs)\n",
     "returned a dict of aux, logits, not one array, for input (2, 32, 32, 3); --task classify scores one array of "
     "logits (batch, --model.num-classes) = (2, 10)"),
    ("import sys\ndef build(cfg, rngs):\n    sys.exit(3)\n", "building the model failed: SystemExit: it called sys.exit(3)"),
    ("import sys\nfrom flax import nnx\n"
     "class Quits(nnx.Module):\n"
     "    def __init__(self, rngs):\n"
     "        self.dense = nnx.Linear(32 * 32 * 3, 10, rngs=rngs)\n"
     "    def __call__(self, x):\n"
     "        sys.exit(0)\n"
     "def build(cfg, rngs):\n    return Quits(rngs)\n",
     "failed: SystemExit: it called sys.exit(0)"),
    ("import jax.numpy as jnp\nfrom flax import nnx\n"
     "class Rounds(nnx.Module):\n"
     "    def __init__(self, rngs):\n"
     "        self.dense = nnx.Linear(32 * 32 * 3, 10, rngs=rngs)\n"
     "    def __call__(self, x):\n"
     "        return self.dense(x.reshape(x.shape[0], -1)).astype(jnp.int32)\n"
     "def build(cfg, rngs):\n    return Rounds(rngs)\n",
     "returned int32 outputs, which no gradient flows through: --task classify scores floating-point logits"),
    # The file's loss and FLOPs, tried before the run folder is made (they used to stop mid-way as internal errors).
    (LINEAR + "def loss(outputs, batch):\n"
              "    return optax.softmax_cross_entropy_with_integer_labels(outputs, batch['label']).mean()\n",
     "loss(outputs, batch) returned shape () for a batch of 2: it must return one float loss per example, shape "
     "(batch,) = (2,), summed over an example's targets, not averaged over the batch"),
    (LINEAR + "def loss(outputs, batch):\n"
              "    return optax.softmax_cross_entropy_with_integer_labels(outputs, batch['labels'])\n",
     "loss(outputs, batch) failed: KeyError: 'labels' (given outputs (2, 10) and a batch of image (2, 32, 32, 3) "
     "uint8, label (2,) int32; it must return one float loss per example, shape (batch,))"),
    (LINEAR + "def loss(outputs, batch):\n    return (outputs.argmax(-1) != batch['label']).astype(int)\n",
     "loss(outputs, batch) returned int32 losses, which no gradient flows through: it must return one float loss "
     "per example"),
    (LINEAR + "def loss(outputs, batch):\n    print(outputs)\n",
     "loss(outputs, batch) returned a NoneType, not an array; it must return one float loss per example"),
    (LINEAR + "def flops_per_example(cfg):\n    return 6 * cfg.model.num_params\n",
     "flops_per_example(cfg) failed: AttributeError: 'ModelConfig' object has no attribute 'num_params' (it must "
     "return the training FLOPs of one example (forward + backward), a number of at least 1)"),
    (LINEAR + "def flops_per_example(cfg):\n    return 0\n",
     "flops_per_example(cfg) returned 0 (int): it must return the training FLOPs of one example"),
    (LINEAR + "def flops_per_example(cfg):\n    return '6e6'\n",
     "flops_per_example(cfg) returned '6e6' (str): it must return the training FLOPs of one example"),
]


@pytest.mark.parametrize(("source", "message"), BAD_PLUGINS, ids=[m.split(":")[0][:24] for _, m in BAD_PLUGINS])
def test_a_bad_plugin_stops_with_one_line_before_anything_compiles(tmp_path: Path, capsys, source: str,
                                                                   message: str) -> None:
    out = tmp_path / "run"
    code = main(["train", "--model", _plugin(tmp_path, source), "--task", "classify", "--data", "synthetic",
                 "--steps", "2", "--out", str(out), "--data.cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not out.exists()  # nothing that a second run with this --out would take for a run to --resume


def test_task_and_model_go_together(micro) -> None:
    with pytest.raises(ConfigError, match="needs --task: choose one of classify, next-token, regress"):
        check_runnable(micro(**{"model.factory": CONVNET["model.factory"]}))
    with pytest.raises(ConfigError, match="--task classify is for a model of your own"):
        check_runnable(micro(**{"model.task": "classify"}))


@pytest.mark.slow
def test_a_loss_in_the_models_file_replaces_the_tasks(micro, tmp_path: Path) -> None:
    """`loss(outputs, batch)` in the file: here 3 for every example (tied to the outputs so that it has a
    gradient), so the run's loss is exactly 3 where the task's cross-entropy would be about ln(10)."""
    source = (EXAMPLES / "convnet.py").read_text() + (
        "\n\ndef loss(outputs, batch):\n    return 3.0 + 0.0 * outputs.sum(-1)\n")
    path = tmp_path / "convnet_own_loss.py"
    path.write_text(source)
    summary = run(_cfg(micro, {**CONVNET, "model.factory": f"{path}:build"}, **{"parallel.strategy": "single"}))
    assert summary["train_loss"] == pytest.approx(3.0, abs=1e-6)
    assert _losses(Path(summary["out"])) == pytest.approx([3.0] * 4, abs=1e-6)


@pytest.mark.slow
def test_a_model_of_your_own_runs_under_shard_map(micro, tmp_path: Path) -> None:
    base = _cfg(micro, CONVNET, **{"parallel.strategy": "fsdp", "parallel.mesh": "8", "parallel.devices": 8,
                                   "train.out": str(tmp_path / "jit")})
    run(base)
    run(override(base, {"parallel.spmd": "shard_map", "train.out": str(tmp_path / "shard_map")}))
    assert _losses(tmp_path / "shard_map") == pytest.approx(_losses(tmp_path / "jit"), rel=2e-5, abs=2e-6)


HAND_COUNTED = '''
from flax import nnx


class Net(nnx.Module):
    def __init__(self, cfg, rngs):
        self.a = nnx.Linear(cfg.model.input_dim, 64, rngs=rngs)
        self.b = nnx.Linear(64, cfg.model.num_classes, rngs=rngs)

    def __call__(self, x):
        return self.b(nnx.relu(self.a(x)))


def build(cfg, rngs):
    return Net(cfg, rngs)
'''


@pytest.mark.slow
def test_xla_counts_one_step_and_an_mfu_over_100_percent_is_not_reported(micro, tmp_path: Path) -> None:
    """(about 5 s.) The FLOPs XLA counts for a model of your own are the step's, by hand: the first layer's
    forward and weight gradient (no input gradient) 4*256*64, the second's forward and both gradients 6*64*10,
    per example, plus under 5% of elementwise work and Adam. A step time that would run them faster than the
    host's peak (the reviewer's 0.15 ms steps at MFU 130%) is no step time: it, the throughput and the MFU are
    dropped with the reason."""
    from shardbench.measure.collect import credible_steps
    from shardbench.measure.run_record import StepTimes

    cfg = micro(**{"model.factory": _plugin(tmp_path, HAND_COUNTED), "model.task": "regress", "data.dataset":
                   "regression", "model.input_dim": 256, "train.batch_size": 256, "train.steps": 4,
                   "parallel.devices": 1, "parallel.mesh": "none"})
    m = run(cfg)["measurements"]
    assert m["attention"] is None  # a model of your own runs no attention of shardbench's
    hand = 256 * (4 * 256 * 64 + 6 * 64 * 10)
    assert hand <= m["flops"]["xla_per_step"] <= 1.05 * hand, (m["flops"]["xla_per_step"], hand)
    assert m["mfu"]["mfu"] is None or m["mfu"]["mfu"] <= 1.0
    peak = m["mfu"]["peak_flops_per_s_per_device"]
    fast = StepTimes(median=hand / peak / 1.3, p90=hand / peak / 1.3, measured_steps=1, excluded_steps=2, warmup=2)
    dropped = credible_steps(fast, hand / fast.median / peak)
    assert dropped.median is None and dropped.p90 is None and dropped.measured_steps == 1
    assert dropped.not_measured.startswith("not credible: the median of 1 interval(s)"), dropped.not_measured
    assert "at 130% of the peak" in dropped.not_measured and "train more steps" in dropped.not_measured
    slow = StepTimes(median=hand / peak / 0.5, p90=hand / peak / 0.5, measured_steps=1, excluded_steps=2, warmup=2)
    assert credible_steps(slow, 0.5) is slow


@pytest.mark.slow
def test_a_model_without_its_own_flop_count_is_measured_by_xla(micro, tmp_path: Path) -> None:
    """(about 2 s.) The two-layer model of the one-device test above, under fsdp on 8 devices, batch 256. Both of
    XLA's counts must come to the same hand count as on one device, 256 x (4*256*64 + 6*64*10) = 17,760,256, plus
    under 5% of elementwise work: the compiled step's (one device's share of the partitioned step, x 8 devices;
    with Adam: measured 2.6% above on one device, 3.4% here, the sharded update's slicing included), and the
    one-device forward and backward's (no optimizer), which MFU divides: over the median step and the peak of all
    8 devices, from the record's own fields."""
    cfg = micro(**{"model.factory": _plugin(tmp_path, HAND_COUNTED), "model.task": "regress", "data.dataset":
                   "regression", "model.input_dim": 256, "train.batch_size": 256, "train.steps": 4,
                   "parallel.strategy": "fsdp", "parallel.mesh": "8", "parallel.devices": 8})
    m = run(cfg)["measurements"]
    flops = m["flops"]
    assert flops["analytic_per_step"] is None and flops["mfu_uses"] == "traced" and m["devices"] == 8
    hand = 256 * (4 * 256 * 64 + 6 * 64 * 10)
    assert hand <= flops["xla_per_step"] <= 1.05 * hand, (flops["xla_per_step"], hand)
    assert hand <= flops["traced_per_step"] <= 1.05 * hand, (flops["traced_per_step"], hand)
    median, peak = m["step_time_s"]["median"], m["mfu"]["peak_flops_per_s_per_device"]
    assert median > 0 and peak > 0
    assert m["mfu"]["mfu"] == pytest.approx(flops["traced_per_step"] / median / (peak * 8), rel=1e-12)


def test_ep_on_a_model_of_your_own_without_experts_says_how_to_name_them(micro) -> None:
    """ep on the convnet, which has no expert dim: the way out is naming one (it advised --model.num-experts N,
    which train refuses for a model of your own)."""
    cfg = _cfg(micro, CONVNET, **{"parallel.strategy": "ep", "parallel.mesh": "expert=8", "parallel.devices": 8})
    with pytest.raises(ConfigError) as err:
        check_runnable(cfg)
    assert "name a parameter dim 'expert'" in str(err.value) and "--model.num-experts" not in str(err.value)


def test_a_dataset_for_another_task_is_named_by_the_task_not_a_built_in_kind() -> None:
    """A model of your own with --task regress and no --data got the preset's synthetic images, refused as "a
    dataset for the vit model, not mlp": two built-in kinds its user never chose. It names the tasks."""
    from shardbench.data.sources import check_model_kind
    from shardbench.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^--data synthetic is a dataset for --task classify, not --task regress: "
                                          r"give --data, one of regression, arrays:PATH$"):
        check_model_kind("synthetic", "mlp", "regress")
    with pytest.raises(ConfigError, match=r"^--data synthetic is a dataset for the vit model, not mlp"):
        check_model_kind("synthetic", "mlp")
    check_model_kind("regression", "mlp", "regress")
