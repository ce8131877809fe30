"""Each strategy lays parameters and optimizer state out as it promises, created directly in place."""

from __future__ import annotations

import math

import jax
import pytest
from jax.sharding import PartitionSpec as P

from shardbench.errors import ConfigError
from shardbench.parallel.mesh import MESH_AXES, MeshShape, parse_mesh
from shardbench.parallel.rules import make_layout
from shardbench.parsing import override
from shardbench.presets import get_preset
from shardbench.optim import build_optimizer
from shardbench.models.spec import describe_model
from shardbench.parallel.checks import check_layout, unsplit_note
from shardbench.train.state import init_state

# Expected PartitionSpecs of a few representative parameters (stacked layers lead every block parameter).
EXPECTED = {
    "dp": {"qkv_kernel": P(None, None, None, None, None), "mlp1_kernel": P(None, None, None),
           "mlp2_kernel": P(None, None, None), "out_kernel": P(None, None, None, None), "head_kernel": P(None, None)},
    "fsdp": {"qkv_kernel": P(None, "data", None, None, None), "mlp1_kernel": P(None, "data", None),
             "mlp2_kernel": P(None, None, "data"), "out_kernel": P(None, None, None, "data"),
             "head_kernel": P("data", None)},
    "tp": {"qkv_kernel": P(None, None, None, "model", None), "mlp1_kernel": P(None, None, "model"),
           "mlp2_kernel": P(None, "model", None), "out_kernel": P(None, "model", None, None),
           "head_kernel": P(None, None)},
    "fsdp+tp": {"qkv_kernel": P(None, "data", None, "model", None), "mlp1_kernel": P(None, "data", "model"),
                "mlp2_kernel": P(None, "model", "data"), "out_kernel": P(None, "model", None, "data"),
                "head_kernel": P("data", None)},
    # Pipelines combined: the stacked 'layers' dim over stage first, then what fsdp or tp splits within a stage
    # (fsdp never the layers dim); what is not stacked (the head) is placed as without stages.
    "fsdp+pp": {"qkv_kernel": P("stage", "data", None, None, None), "mlp1_kernel": P("stage", "data", None),
                "mlp2_kernel": P("stage", None, "data"), "out_kernel": P("stage", None, None, "data"),
                "head_kernel": P("data", None)},
    "pp+tp": {"qkv_kernel": P("stage", None, None, "model", None), "mlp1_kernel": P("stage", None, "model"),
              "mlp2_kernel": P("stage", "model", None), "out_kernel": P("stage", "model", None, None),
              "head_kernel": P(None, None)},
    "dp+pp+tp": {"qkv_kernel": P("stage", None, None, "model", None), "mlp1_kernel": P("stage", None, "model"),
                 "mlp2_kernel": P("stage", "model", None), "out_kernel": P("stage", "model", None, None),
                 "head_kernel": P(None, None)},
    # ... and fsdp within each stage too: each stacked kernel's remaining whole dim over data.
    "fsdp+pp+tp": {"qkv_kernel": P("stage", "data", None, "model", None), "mlp1_kernel": P("stage", "data", "model"),
                   "mlp2_kernel": P("stage", "model", "data"), "out_kernel": P("stage", "model", None, "data"),
                   "head_kernel": P("data", None)},
}
MESHES = {"dp": ("8", 8), "fsdp": ("8", 8), "tp": ("model=4", 4), "fsdp+tp": ("4x2", 8),
          "fsdp+pp": ("data=4,stage=2", 8), "pp+tp": ("stage=2,model=4", 8),
          "dp+pp+tp": ("data=2,stage=2,model=2", 8), "fsdp+pp+tp": ("data=2,stage=2,model=2", 8)}


def _state(strategy: str, mesh: str, devices: int = 8):
    cfg = override(get_preset("vit-tiny"), {"parallel.strategy": strategy,
                                                                   "parallel.mesh": mesh})
    layout = make_layout(strategy, mesh, jax.devices()[:devices])
    spec = describe_model(cfg)
    check_layout(spec, layout)
    tx = build_optimizer(cfg.optim, 100)
    return init_state(cfg, spec, layout, tx), layout


def _normalise(spec: P, ndim: int) -> P:
    return P(*(list(spec) + [None] * (ndim - len(spec))))


@pytest.mark.parametrize("strategy", list(EXPECTED))
def test_parameters_and_optimizer_state_have_the_promised_shardings(strategy: str) -> None:
    state, layout = _state(strategy, *MESHES[strategy])
    blocks = state.params["encoder"]
    adam = state.opt_state[1][0]  # chain(clip, adamw) -> adamw's ScaleByAdamState
    for name, want in EXPECTED[strategy].items():
        param = blocks[name] if name in blocks else state.params[name]
        assert _normalise(param.sharding.spec, param.ndim) == want, (strategy, name, param.sharding.spec)
        for moment in (adam.mu, adam.nu):
            m = moment["encoder"][name] if name in blocks else moment[name]
            assert m.sharding == param.sharding, (strategy, name)
        # Each device holds exactly its shard, not a whole copy. (Whether `init_state` made it in place or copied it
        # there is not seen here: on a CPU its draws are whole arrays anyway, see `train.state.init_state`.)
        shard_shape = param.sharding.shard_shape(param.shape)
        assert all(s.data.shape == shard_shape for s in param.addressable_shards)
    assert state.step.sharding.is_fully_replicated


def test_fsdp_holds_an_eighth_of_the_big_kernels_per_device() -> None:
    state, _ = _state("fsdp", "8")
    kernel = state.params["encoder"]["mlp1_kernel"]
    per_device = kernel.addressable_shards[0].data.size
    assert per_device * 8 == kernel.size


@pytest.mark.slow
def test_fsdp_holds_an_eighth_of_all_parameter_and_optimizer_bytes() -> None:
    from shardbench.measure.memory import per_device_bytes

    fsdp, _ = _state("fsdp", "8")
    dp, _ = _state("dp", "8")
    for part in ("params", "opt_state"):
        replicated = per_device_bytes(getattr(dp, part))
        sharded = per_device_bytes(getattr(fsdp, part))
        # Only arrays no dim of which divides by 8 stay whole: the 10-class head bias (40 bytes per copy)
        # and the optimizer's step counters.
        assert replicated / 8 <= sharded <= replicated / 8 + 3 * 40 + 64, (part, replicated, sharded)


def test_fsdp_falls_back_to_a_dimension_that_divides() -> None:
    cfg = override(get_preset("vit-tiny"), {"model.embed_dim": 132, "model.num_heads": 4,
                                                                   "model.mlp_dim": 256})
    layout = make_layout("fsdp", "8", jax.devices())
    spec = describe_model(cfg)
    check_layout(spec, layout)  # no error: FSDP never needs a dimension that does not divide
    assert layout.param_spec(("layers", "embed", "mlp"), (4, 132, 256)) == P(None, None, "data")
    assert layout.param_spec(("classes",), (10,)) == P(None)


def test_dp_replicates_everything() -> None:
    state, _ = _state("dp", "8")
    assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves(state))


@pytest.mark.parametrize(
    ("spec", "strategy", "devices", "data", "model", "stage"),
    [("", "dp", 8, 8, 1, 1), ("", "tp", 8, 1, 8, 1), ("", "auto", 8, 8, 1, 1), ("4x2", "auto", 8, 4, 2, 1),
     ("8", "fsdp", 8, 8, 1, 1), ("4x2", "dp+tp", 8, 4, 2, 1), ("data=2,model=4", "fsdp+tp", 8, 2, 4, 1),
     ("model=2,data=2", "dp+tp", 4, 2, 2, 1), ("", "pp", 4, 1, 1, 4), ("stage=4,data=2", "dp+pp", 8, 2, 1, 4),
     ("", "pp+tp", 8, 1, 1, 8), ("stage=4,model=2", "auto", 8, 1, 2, 4), ("data=2,stage=2,model=2", "auto", 8, 2, 2, 2),
     ("stage=2,data=4", "fsdp+pp", 8, 4, 1, 2)],
)
def test_mesh_specs(spec: str, strategy: str, devices: int, data: int, model: int, stage: int) -> None:
    layout = make_layout(strategy, spec, jax.devices()[:devices])
    assert (layout.shape.data, layout.shape.model, layout.shape.stage) == (data, model, stage)
    # The built mesh carries every known axis, outermost first, whole where the run does not split it.
    assert dict(layout.mesh.shape) == {**dict.fromkeys(MESH_AXES, 1), "data": data, "stage": stage, "model": model}
    assert tuple(layout.mesh.shape) == MESH_AXES


@pytest.mark.parametrize(
    ("strategy", "mesh", "devices", "message"),
    [
        ("dp", "4x2", 8, "strategy dp does not use the model axis"),
        # the mesh as it was written, not its 4x1 or 1x4
        ("dp", "4", 8, "--mesh 4 has 4 devices but 8 devices are in use"),
        ("tp", "model=4", 8, "--mesh model=4 has 4 devices but 8 devices are in use"),
        ("dp+tp", "4x4", 8, "has 16 devices but 8 devices are in use"),
        ("dp", "4by2", 8, "is not a mesh"),
        ("dp", "\uff18", 8, "is not a mesh"),  # a full-width 8, which int() reads as 8
        ("dp", "data=-2,model=-4", 8, "a size is negative; every axis needs at least one device"),
        ("dp", "-8", 8, "a size is negative"),
        ("dp", "-4x2", 8, "a size is negative"),
        ("dp", "data=2,model=4,8", 8, "a list of meshes \\(a sweep's\\) is separated by ';'"),
        ("dp", "data=\u0664,model=2", 8, "is not a mesh"),  # an Arabic-Indic 4
        ("single", "8", 8, "strategy single runs on one device"),
        ("fsdp", "none", 8, "--mesh none means one device without a mesh, but strategy fsdp needs a mesh"),
        # A pipeline that would also split over an axis its strategy does not use: the strategy that does.
        ("fsdp+pp", "data=2,stage=2,model=2", 8, "strategy fsdp\\+pp does not use the model axis .* use --strategy "
                                                "fsdp\\+pp\\+tp"),
        ("pp", "stage=4,model=2", 8, "use --strategy pp\\+tp"),
        # ZeRO with a model or stage axis: the strategy that keeps the optimizer state split (not dp+tp, which
        # would silently replicate it), saying that it splits the parameters too
        ("zero2", "4x2", 8, "use --strategy fsdp\\+tp \\(no ZeRO strategy uses the model axis: fsdp\\+tp keeps the "
                            "optimizer state and gradients split over data, and splits the parameters too\\)"),
        ("zero1", "data=2,stage=2", 4, "use --strategy fsdp\\+pp \\(no ZeRO strategy uses the stage axis: fsdp\\+pp "
                                       "keeps the optimizer state split over data"),
    ],
)
def test_bad_meshes(strategy: str, mesh: str, devices: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_layout(strategy, mesh, jax.devices()[:devices])


@pytest.mark.parametrize(
    ("overrides", "mesh", "message"),
    [
        ({"model.num_heads": 2, "model.embed_dim": 128}, "1x4", "model.num_heads = 2 is not divisible by the model axis"),
        ({"model.mlp_dim": 258}, "1x4", "model.mlp_dim = 258 is not divisible by the model axis"),
    ],
)
def test_indivisible_dimensions_are_named(overrides: dict, mesh: str, message: str) -> None:
    strategy = "fsdp" if mesh == "8" else "tp"
    cfg = override(get_preset("vit-tiny"), overrides)
    layout = make_layout(strategy, mesh.replace("1x4", "model=4"), jax.devices()[: 8 if mesh == "8" else 4])
    with pytest.raises(ConfigError, match=message):
        check_layout(describe_model(cfg), layout)


@pytest.mark.parametrize(("strategy", "mesh", "devices", "note"), [
    ("fsdp+pp+tp", "8", 8, "strategy fsdp+pp+tp on mesh 8x1: its stage and model axes have one device each, so "
                           "nothing is split over them; a mesh naming their sizes splits them (--mesh "
                           "data=N,stage=N,model=N)"),
    ("dp+tp", "8", 8, "strategy dp+tp on mesh 8x1: its model axis has one device, so nothing is split over it; a "
                      "mesh naming its size splits it (--mesh data=N,model=N)"),
    ("dp+tp", "4x2", 8, None), ("fsdp+pp+tp", "data=2,stage=2,model=2", 8, None), ("dp", "8", 8, None),
    ("dp+tp", "1x1", 1, None), ("single", "none", 1, None),
    ("pp+tp", "stage=1,model=2", 2, None),  # an axis named at 1 is one on purpose (a one-stage reference)
    ("dp+tp", "8x1", 8, None),  # as is AxB's model axis
    ("fsdp+pp+tp", "data=4,stage=1", 4, "strategy fsdp+pp+tp on mesh 4x1: its model axis has one device, so nothing "
                                       "is split over it; a mesh naming its size splits it (--mesh "
                                       "data=N,stage=N,model=N)"),
])
def test_a_strategy_whose_axes_the_mesh_leaves_whole_says_so(strategy: str, mesh: str, devices: int,
                                                            note: str | None) -> None:
    assert unsplit_note(make_layout(strategy, mesh, jax.devices()[:devices]), mesh) == note


def test_parse_mesh_rejects_unknown_axis() -> None:
    with pytest.raises(ConfigError, match="unknown axis 'pipe'"):
        parse_mesh("pipe=8", 8)


@pytest.mark.parametrize("mesh", ["data=4294967296,model=4294967296", "data=3037000500,model=3037000500",
                                  "data=65536,model=65536,expert=65536"])
def test_a_mesh_too_large_for_any_machine_is_said_without_wrapping(mesh: str) -> None:
    """Its size is the exact product (numpy's int64 made 2**64 devices 0 and 3037000500**2 negative), and a size
    past any machine's is one line naming it, whether the devices are counted (train) or not (inspect)."""
    sizes = dict(part.split("=") for part in mesh.split(","))
    exact = math.prod(int(v) for v in sizes.values())
    assert MeshShape.of(**{axis: int(v) for axis, v in sizes.items()}).size == exact
    for devices in (8, None):
        with pytest.raises(ConfigError, match=r"names [\d,]+ devices, more than any machine holds") as err:
            parse_mesh(mesh, devices)
        assert f"names {exact:,} devices" in str(err.value)
        assert "--devices" not in str(err.value) and "\n" not in str(err.value)


def test_a_mesh_beyond_the_simulated_devices_is_said_in_the_meshs_words() -> None:
    """`inspect` simulates the devices a mesh names: past MAX_SIMULATED the mesh is refused by its own flag (it
    was refused as --devices, which was never given), and a mismatched count offers --devices only where that
    many can be simulated."""
    from shardbench.devices import MAX_SIMULATED
    from shardbench.parallel.mesh import mesh_size

    assert mesh_size(f"data={MAX_SIMULATED // 2},model=2") == MAX_SIMULATED
    with pytest.raises(ConfigError, match=f"--mesh {MAX_SIMULATED + 1} names {MAX_SIMULATED + 1:,} devices, more "
                                          f"than the {MAX_SIMULATED} CPU devices"):
        mesh_size(str(MAX_SIMULATED + 1))
    with pytest.raises(ConfigError, match="or pass --devices 16$"):
        parse_mesh("16", 8)
    with pytest.raises(ConfigError, match="equal the device count$"):
        parse_mesh(str(MAX_SIMULATED * 2), 8)


@pytest.mark.parametrize(("mesh", "says"), [
    ("stage=2,model=2,expert=2", "--strategy auto: no strategy splits stage, model and expert together (--mesh "
                                 "stage=2,model=2,expert=2); the nearest are pp+tp over stage and model, ep+tp over "
                                 "model and expert: "),
    ("data=2,stage=2,seq=2", "no strategy splits data, stage and seq together (--mesh data=2,stage=2,seq=2); the "
                             "nearest are dp+pp or fsdp+pp over data and stage, dp+cp or fsdp+cp over data and seq"),
    ("model=2,expert=4", "--mesh model=2,expert=4 splits model and expert, which auto picks no strategy for: name "
                         "one, --strategy ep+tp"),
])
def test_auto_on_a_mesh_it_has_no_strategy_for_says_so(mesh: str, says: str) -> None:
    """It used to fall back to dp, whose refusal named one axis and a strategy that the next axis refused."""
    with pytest.raises(ConfigError) as err:
        make_layout("auto", mesh, jax.devices())
    assert says in str(err.value) and "\n" not in str(err.value)
    assert "strategy dp does not use" not in str(err.value)


@pytest.mark.parametrize(("strategy", "mesh", "says"), [
    ("dp", "stage=2,model=2,expert=2", "strategy dp does not use the stage axis but --mesh stage=2,model=2,expert=2 "
                                       "gives it 2 devices, and no strategy splits stage, model and expert together: "
                                       "put every device on data"),
    ("tp", "data=2,stage=2,model=2", "use --strategy dp+pp+tp, or put every device on model"),
    ("fsdp", "data=2,stage=2,model=2", "use --strategy fsdp+pp+tp, or put every device on data"),
    ("pp", "data=2,stage=2,seq=2", "and no strategy splits data, stage and seq together: put every device on stage"),
])
def test_a_strategy_refusing_an_axis_names_one_that_uses_every_split_axis(strategy: str, mesh: str,
                                                                          says: str) -> None:
    """The advice is a strategy that takes the whole mesh (dp on data,stage,model was told dp+pp, which then
    refused model), or, where none does, says that none does."""
    with pytest.raises(ConfigError) as err:
        make_layout(strategy, mesh, jax.devices())
    assert says in str(err.value)
    advised = str(err.value).split("use --strategy ")[1].split(",")[0] if "use --strategy" in str(err.value) else ""
    if advised:
        make_layout(advised, mesh, jax.devices())  # the advice runs


@pytest.mark.parametrize(("mesh", "devices", "strategy"),
                         [("none", 8, "single"), ("8x1", 8, "dp"), ("", 8, "dp"), ("4x2", 8, "dp+tp"),
                          ("model=4", 4, "tp")])
def test_auto_strategy_follows_the_mesh(mesh: str, devices: int, strategy: str) -> None:
    layout = make_layout("auto", mesh, jax.devices()[:devices])
    assert layout.strategy.name == strategy
    assert (layout.mesh is None) == (strategy == "single")


def test_a_new_strategy_is_an_entry_of_tactics(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a way of splitting is adding an entry: FSDP over the model axis beside Megatron's table, written
    as data in this test, places parameters with no change to the layout code."""
    from shardbench.models.axes import BATCH
    from shardbench.parallel import strategies

    megatron = strategies.ByName({"heads": "model", "mlp": "model"})
    entry = strategies.Strategy("tp+fsdp-model", (megatron, strategies.Largest("model")), {BATCH: "data"},
                                ("data", "model"), "data", "test entry")
    monkeypatch.setitem(strategies.STRATEGIES, entry.name, entry)
    layout = make_layout(entry.name, "2x4", jax.devices())
    # Megatron's table takes the heads dim; FSDP over 'model' finds that axis used and leaves the array alone.
    assert layout.param_spec(("layers", "embed", None, "heads", None), (2, 64, 3, 4, 16)) == P(
        None, None, None, "model", None)
    # An array the table leaves whole gets its 'embed' dim over 'model', where 4 divides it.
    assert layout.param_spec(("embed", "classes"), (64, 10)) == P("model", None)
    # Nothing divides: replicated, and nothing refused (FSDP only takes dims that divide).
    assert layout.param_spec(("classes",), (10,)) == P(None)
    layout.check_divisible({"b": ("classes",)}, {"b": (10,)}, {})


def test_fsdp_is_dp_plus_one_tactic() -> None:
    """fsdp places every array as dp (whole) plus at most one dim over 'data'; fsdp+tp as tp plus one."""
    from shardbench.parallel.strategies import STRATEGIES

    shapes = [(("layers", "embed", None, "heads", None), (2, 64, 3, 4, 16)), (("embed", "mlp"), (64, 256)),
              (("classes",), (10,)), (("layers", "mlp", "embed"), (2, 256, 64))]
    for base, sharded, mesh in (("dp", "fsdp", "8"), ("dp+tp", "fsdp+tp", "2x4")):
        assert STRATEGIES[sharded].params[:len(STRATEGIES[base].params)] == STRATEGIES[base].params
        plain, fsdp = make_layout(base, mesh, jax.devices()), make_layout(sharded, mesh, jax.devices())
        for axes, shape in shapes:
            a, b = plain.param_spec(axes, shape), fsdp.param_spec(axes, shape)
            added = [d for d, (x, y) in enumerate(zip(a, b)) if x != y]
            assert len(added) <= 1 and all(a[d] is None and b[d] == "data" for d in added), (axes, a, b)
            if added:
                assert axes[added[0]] != "layers" and shape[added[0]] % fsdp.shape.data == 0


@pytest.mark.parametrize(("spec", "text"), [("4x2", "4x2"), ("data=8", "8x1"), ("model=2,data=4", "4x2"),
                                            ("stage=4,data=2", "data=2,stage=4")])
def test_a_mesh_is_named_axis_sizes(spec: str, text: str) -> None:
    shape = parse_mesh(spec, 8)
    assert str(shape) == text and shape.as_dict() == {**dict.fromkeys(MESH_AXES, 1), "data": shape.data,
                                                      "stage": shape.stage, "model": shape.model}
    assert parse_mesh(str(shape), 8) == shape  # what a run records reads back as the same mesh


def test_parse_mesh_refuses_an_axis_named_twice() -> None:
    with pytest.raises(ConfigError, match="axis 'data' is named twice"):
        parse_mesh("data=2,data=4", 8)


@pytest.mark.parametrize(("strategy", "mesh", "devices", "note"), [
    ("dp+tp", "", 8, "strategy dp+tp on mesh 8x1: its model axis has one device, so nothing is split over it; a "
                     "mesh naming its size splits it (--mesh data=N,model=N)"),
    ("dp+tp", "8x1", 8, None),  # a model axis of one, named: on purpose
    ("dp+tp", "4x2", 8, None),
    ("dp", "8x1", 8, None),  # one axis: the strategy is what it says
])
def test_a_composite_strategy_with_an_axis_of_one_device_says_so(micro, strategy: str, mesh: str, devices: int,
                                                                 note: str | None) -> None:
    """`--strategy dp+ep` on 2 devices with no mesh ran as dp on mesh 2x1 under its composite name, with nothing
    said; its layout's notes now say which of its axes splits nothing (once: the header said it too, in other
    words)."""
    from shardbench.parallel.checks import layout_notes
    from shardbench.preflight import check_run
    from shardbench.train.console import header_line

    checked = check_run(micro(**{"parallel.strategy": strategy, "parallel.mesh": mesh, "parallel.devices": devices}))
    notes = layout_notes(checked.spec, checked.layout, mesh)
    assert notes == ([] if note is None else [note]), notes
    assert "split" not in header_line(checked)


def test_an_unknown_strategy_name_is_refused_in_the_flags_words() -> None:
    """The strategies' table is looked up by the name the configuration declares; any other name gets the same line
    `--strategy` gives, listing the table's names (the planner and tune reach the table without the flag)."""
    from shardbench.parallel.strategies import STRATEGIES, get_strategy
    from shardbench.tune.space import Space, enumerate_space

    assert get_strategy("fsdp").name == "fsdp"
    with pytest.raises(ConfigError, match=r"^unknown --strategy 'zero3': choose one of single, dp, ") as err:
        get_strategy("zero3")
    assert all(name in str(err.value) for name in STRATEGIES)
    with pytest.raises(ConfigError, match=r"^unknown --candidates 'zero3': choose one of .* \(a comma list\)$"):
        enumerate_space(8, Space(strategies=("dp", "zero3")))


def test_the_header_says_sequence_parallelism(micro) -> None:
    """--parallel.sequence-parallel changes what tp splits (its LayerNorm and dropout regions, along the
    sequence) and was said neither in the first line nor in the run's name (`test_measure`)."""
    from shardbench.preflight import check_run
    from shardbench.train.console import header_line

    args = {"parallel.strategy": "tp", "parallel.mesh": "model=4", "parallel.devices": 4, "model.pool": "mean"}
    assert "| tp with sequence parallelism on mesh 1x4, jit (4 cpu device(s)) |" in header_line(
        check_run(micro(**args, **{"parallel.sequence_parallel": True})))
    assert "| tp on mesh 1x4, jit (4 cpu device(s)) |" in header_line(check_run(micro(**args)))
