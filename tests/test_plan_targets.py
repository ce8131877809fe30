"""Planning: targets by count and chip, and the candidate layouts for a device count: strategies (zero1 and zero2
among them), meshes and numbers of accumulated microbatches."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from shardbench import config as config_lib
from shardbench.cli import build_parser
from shardbench.errors import ConfigError
from shardbench.parsing import override
from shardbench.hardware import CHIPS
from shardbench.plan.candidates import (DEFAULT, candidate_config, candidates, factorisations, folded_line,
                                        one_per_layout)
from shardbench.plan.plan_cmd import prepare
from shardbench.plan.target import parse_target
from shardbench.plan.tpu import libtpu_installed
from shardbench.presets import get_preset


def test_targets_by_count_and_chip() -> None:
    one = parse_target("8xh100")
    assert (one.chip.name, one.devices, one.per_node, one.nodes) == ("h100", 8, 8, 1)
    two = parse_target("2x8xh100")
    assert (two.devices, two.per_node, two.nodes) == (16, 8, 2)
    slice_ = parse_target("tpu-v5e:16x16")
    assert (slice_.chip.name, slice_.devices, slice_.topology, slice_.nodes) == ("tpu-v5e", 256, (16, 16), 32)
    assert parse_target("tpu-v4:4x4x4").devices == 64 and parse_target("cpu", 8).devices == 8


@pytest.mark.parametrize(("spec", "message"), [
    ("8xh900", "unknown chip 'h900'"), ("eight h100", "is not a target"), ("tpu-v5e:16", "a TPU slice is"),
    ("8xtpu-v5e", "give a TPU slice by its topology"), ("h100:2x4", "a topology (:2x4) is for TPU chips"),
])
def test_bad_targets_are_named_in_one_line(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        parse_target(spec)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("spec", "right"), [
    ("tpu-v5e:3x3", "tpu-v5e:4x4"), ("tpu-v5e:1x3", "tpu-v5e:2x4"), ("tpu-v4:3x3x3", "tpu-v4:4x4x3"),
    ("tpu-v5e:2x3", "tpu-v5e:2x4"),
])
def test_a_slice_larger_than_a_host_is_made_of_whole_hosts(spec: str, right: str) -> None:
    """libtpu lays a slice out in hosts of 2x2 chips: one whose first two sides do not split into them compiled
    nothing (every candidate "failed to compile", exit 1 with nothing on stderr); it is refused in one line before
    compiling, with the nearest slice of whole hosts. A slice within one host is that host's."""
    with pytest.raises(ConfigError) as err:
        parse_target(spec)
    assert str(err.value) == (f"--target {spec}: a slice larger than one host is made of whole hosts of 2x2 chips, "
                              f"so its first two sides are even; e.g. {right}")
    for good in ("tpu-v5e:1x1", "tpu-v5e:1x2", "tpu-v5e:2x6", "tpu-v4:2x2x1", "tpu-v4:4x4x5", "tpu-v6e:16x16"):
        parse_target(good)


@pytest.mark.parametrize(("spec", "right"), [
    ("tpu-v5e:2x2x2", "a v5e slice is 2-D (AxB, e.g. tpu-v5e:2x4)"),
    ("tpu-v5e:2x4x1", "a v5e slice is 2-D (AxB, e.g. tpu-v5e:2x4)"),  # the same 8 chips, as Google spells them
    ("tpu-v6e:4x4x4", "a v6e slice is 2-D (AxB, e.g. tpu-v6e:8x8)"),  # 64 chips on the squarest 2-D slice
    ("tpu-v3:2x2x2", "a v3 slice is 2-D (AxB, e.g. tpu-v3:2x4)"),
    ("tpu-v2:1x2x2", "a v2 slice is 2-D (AxB, e.g. tpu-v2:2x2)"),
    ("tpu-v4:2x2", "a v4 slice is 3-D (AxBxC, e.g. tpu-v4:2x2x1)"),
    ("tpu-v5p:4x8", "a v5p slice is 3-D (AxBxC, e.g. tpu-v5p:4x8x1)"),
])
def test_a_slice_has_the_sides_of_its_chips_pods(spec: str, right: str) -> None:
    """v2, v3, v5e and v6e pods are 2-D tori, v4 and v5p pods 3-D: a slice of another number of sides is no
    hardware (libtpu describes it all the same), refused in one line with a spelling of the right number of sides.
    Every TPU in the table says its sides, and every GPU none."""
    with pytest.raises(ConfigError) as err:
        parse_target(spec)
    assert str(err.value) == f"--target {spec}: {right}"
    assert {c.name: c.slice_dims for c in CHIPS if c.name.startswith("tpu-")} == {
        "tpu-v6e": 2, "tpu-v5e": 2, "tpu-v5p": 3, "tpu-v4": 3, "tpu-v3": 2, "tpu-v2": 2}
    assert all(c.slice_dims is None for c in CHIPS if not c.name.startswith("tpu-"))
    for good in ("tpu-v5e:2x4", "tpu-v6e:16x16", "tpu-v4:2x2x1", "tpu-v5p:4x4x8", "tpu-v3:4x4", "tpu-v2:2x2"):
        assert parse_target(good).topology == tuple(int(v) for v in good.split(":")[1].split("x"))


@pytest.mark.parametrize(("spec", "right"), [
    ("16xh100", "one h100 node holds 8; write 2x8xh100"), ("2x16xh100", "one h100 node holds 8; write 4x8xh100"),
    ("12xa100", "one a100 node holds 8; write 2x6xa100"), ("9xb200", "one b200 node holds 8; write 3x3xb200"),
])
def test_more_gpus_than_a_node_holds_are_refused_with_the_nodes_spelled_out(spec: str, right: str) -> None:
    """An H100 node (DGX/HGX) holds 8: 16 H100s are two nodes with InfiniBand between them, never one node of 16
    all on NVLink. The hint spreads the same GPUs evenly over the fewest nodes: 16 -> 2 of 8, 32 -> 4 of 8,
    12 -> 2 of 6, 9 -> 3 of 3."""
    with pytest.raises(ConfigError) as err:
        parse_target(spec)
    assert str(err.value) == f"--target {spec}: {right}"
    full = parse_target("2x8xh100")
    assert (full.devices, full.per_node, full.nodes) == (16, 8, 2)
    assert (parse_target("8xh100").nodes, parse_target("3x3xb200").nodes) == (1, 3)


@pytest.mark.parametrize(("spec", "one_node"), [("2x8xv100", "8xv100"), ("4x2xl4", "2xl4")])
def test_a_chip_with_no_bandwidth_between_nodes_is_planned_on_one_node_only(spec: str, one_node: str) -> None:
    """The v100's and the l4's data sheets give no bandwidth between nodes: their traffic across nodes cannot be
    timed from the data sheet, so a target across nodes is refused; one node of them is planned."""
    with pytest.raises(ConfigError) as err:
        parse_target(spec)
    chip = one_node.split("x")[-1]
    assert str(err.value) == (f"--target {spec}: the {chip}'s data sheet gives no bandwidth between nodes; plan one "
                              f"node ({one_node})")
    assert parse_target(one_node).nodes == 1


def test_candidates_cover_every_usable_mesh() -> None:
    assert factorisations(8) == [(1, 8), (2, 4), (4, 2), (8, 1)]
    found = {(c.strategy, c.mesh) for c in candidates(8, 4096, ["dp", "fsdp", "tp", "dp+tp", "fsdp+tp"],
                                                        ["none"], ["bfloat16"])}
    assert found == {("dp", "8x1"), ("fsdp", "8x1"), ("tp", "1x8"), ("dp+tp", "2x4"), ("dp+tp", "4x2"),
                     ("fsdp+tp", "2x4"), ("fsdp+tp", "4x2")}
    assert len(candidates(8, 4096, ["dp", "tp"], ["none", "block"], ["float32", "bfloat16"])) == 2 * 2 * 2
    # batch 6 on 8 devices: only layouts whose data axis divides it (tp: 1; dp+tp 2x4: 2)
    assert {(c.strategy, c.mesh) for c in candidates(8, 6, ["dp", "tp", "dp+tp"], ["none"], ["float32"])} == {
        ("tp", "1x8"), ("dp+tp", "2x4")}
    with pytest.raises(ConfigError, match="--batch-size 7 is divisible by no candidate's data-parallel size"):
        candidates(8, 7, ["dp", "fsdp"], ["none"], ["float32"])
    with pytest.raises(ConfigError, match="no candidate mesh uses 8 devices"):
        candidates(8, 8, ["single"], ["none"], ["float32"])


def test_one_device_keeps_one_candidate_per_layout() -> None:
    """On 1 device every strategy of one axis is a 1x1 mesh: dp, fsdp, tp, zero1, zero2 (and ep, cp) hold every
    array whole and send nothing, as single does, so single is kept, at every remat, dtype and K; a pipeline of one
    stage still runs its microbatches (another step) and stays. Without single the first of the table stands in
    (dp, not cp, which refuses a model without attention); on 8 devices nothing is folded."""
    strategies = [*DEFAULT, "ep", "cp", "pp"]
    every = candidates(1, 32, strategies, ["none", "block"], ["float32", "bfloat16"], [1, 2], per_stage=[1],
                       schedules=["gpipe"])
    kept, folded = one_per_layout(every, 1)
    assert {c.strategy for c in kept} == {"single", "pp"}
    assert sorted((c.remat, c.dtype, c.grad_accum) for c in kept if c.strategy == "single") == sorted(
        (r, d, k) for r in ("none", "block") for d in ("float32", "bfloat16") for k in (1, 2))
    assert folded == {s: "single" for s in ("dp", "fsdp", "tp", "zero1", "zero2", "ep", "cp")}
    assert folded_line(folded).startswith("on 1 device dp, fsdp, tp, zero1, zero2, ep, cp lay out as single: ")
    without = candidates(1, 32, ["cp", "tp", "dp"], ["none"], ["float32"])
    kept, folded = one_per_layout(without, 1)
    assert [c.name for c in kept] == ["dp 1x1 remat=none float32"] and folded == {"cp": "dp", "tp": "dp"}
    assert folded_line(folded).startswith("on 1 device cp, tp lay out as dp: ")
    assert folded_line({"zero1": "single"}).startswith("on 1 device zero1 lays out as single: ")
    eight = candidates(8, 32, strategies, ["none"], ["float32"])
    assert one_per_layout(eight, 8) == (eight, {}) and folded_line({}) == ""


def test_a_one_device_plan_is_prepared_with_one_candidate_per_layout() -> None:
    args = build_parser().parse_args(["plan", "--preset", "mlp-small", "--target", "1xh100", "--remat", "none,block"])
    _, target, found, folded = prepare(args)
    assert target.devices == 1 and [c.name for c in found] == ["single none remat=none float32",
                                                                "single none remat=block float32"]
    assert folded == {s: "single" for s in ("dp", "fsdp", "tp", "zero1", "zero2")}


def test_zero_and_accumulation_candidates() -> None:
    """zero1 and zero2 take the data axis from the strategies' table; each K of --grad-accum multiplies the
    layouts whose examples per data shard it divides (batch 32: 4 a shard on 8x1, 32 on tp's 1x8), and the
    configuration a candidate compiles trains K microbatches."""
    found = candidates(8, 32, ["dp", "zero1", "zero2", "tp"], ["none"], ["float32"], [1, 4, 8])
    assert sorted((c.strategy, c.mesh, c.grad_accum) for c in found) == sorted(
        [(s, "8x1", k) for s in ("dp", "zero1", "zero2") for k in (1, 4)] + [("tp", "1x8", k) for k in (1, 4, 8)])
    names = {c.name for c in found}
    assert {"zero2 8x1 remat=none float32", "zero2 8x1 remat=none float32 accum=4",
            "tp 1x8 remat=none float32 accum=8"} <= names
    assert len(names) == len(found)
    accum = next(c for c in found if c.strategy == "zero2" and c.grad_accum == 4)
    cfg = override(config_lib.Config(), candidate_config(get_preset("mlp-small"), accum, 8))
    assert (cfg.parallel.strategy, cfg.parallel.mesh, cfg.parallel.devices, cfg.train.grad_accum) == (
        "zero2", "8x1", 8, 4)
    # By default (no --grad-accum) every candidate trains the batch in one pass, as before.
    assert {c.grad_accum for c in candidates(8, 32, ["zero1"], ["none"], ["float32"])} == {1}
    with pytest.raises(ConfigError, match=r"--grad-accum 3 divides no candidate's examples per data shard "
                                          r"\(4 at --batch-size 32\)") as err:
        candidates(8, 32, ["dp", "zero2"], ["none"], ["float32"], [1, 3])
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("given", "expected"), [("1,4", [1, 4]), ("4,04,1", [4, 1])])
def test_plan_takes_a_list_of_microbatch_counts(given: str, expected: list[int]) -> None:
    args = build_parser().parse_args(["plan", "--preset", "mlp-small", "--target", "8xh100", "--candidates",
                                      "zero2", "--batch-size", "32", "--remat", "none", "--grad-accum", given])
    cfg, _, found, folded = prepare(args)
    assert [c.grad_accum for c in found] == expected and cfg.train.grad_accum == expected[0] and folded == {}


@pytest.mark.parametrize("given", ["0", "1,two", "-2", "2.5"])
def test_a_bad_microbatch_count_is_one_line(given: str) -> None:
    args = build_parser().parse_args(["plan", "--preset", "mlp-small", "--target", "8xh100", "--grad-accum", given])
    with pytest.raises(ConfigError, match="--grad-accum") as err:
        prepare(args)
    assert "\n" not in str(err.value)


def test_a_plan_considers_the_pipelines_only_when_named() -> None:
    """Each pipeline multiplies into stages x microbatches x schedules: by default a plan leaves every strategy
    with stages out, and every other strategy in."""
    from shardbench.plan.candidates import DEFAULT, USES

    pipelines = {name for name, axes in USES.items() if "stage" in axes}
    experts = {name for name, axes in USES.items() if "expert" in axes}  # planned for a model with experts
    context = {name for name, axes in USES.items() if "seq" in axes}  # only when named (docs/planning.md)
    assert pipelines == {"pp", "dp+pp", "fsdp+pp", "pp+tp", "dp+pp+tp", "fsdp+pp+tp"}
    assert experts == {"ep", "dp+ep", "fsdp+ep", "ep+tp"} and context == {"cp", "dp+cp", "fsdp+cp", "cp+tp"}
    assert set(DEFAULT) == set(USES) - pipelines - experts - context


def test_a_tpu_v2_or_v3_chip_is_two_jax_devices() -> None:
    """A TPU v2 or v3 chip is two JAX devices (one per TensorCore), so a slice of 4x4 v3 chips is 32 devices on 4
    hosts of 4 chips (8 devices) each; a v5e chip is one device, as before."""
    v3 = parse_target("tpu-v3:4x4")
    assert (v3.devices, v3.chips, v3.per_node, v3.nodes, v3.topology) == (32, 16, 8, 4, (4, 4))
    assert v3.counted() == "32 devices (16 tpu-v3 chips)"
    v2 = parse_target("tpu-v2:2x2")
    assert (v2.devices, v2.chips, v2.per_node, v2.nodes) == (8, 4, 8, 1)
    v5e = parse_target("tpu-v5e:4x4")
    assert (v5e.devices, v5e.chips, v5e.per_node, v5e.nodes) == (16, 16, 8, 2) and v5e.counted() == "16 device(s)"
    assert parse_target("2x8xh100").chips == 16 and parse_target("cpu", 8).chips == 8


# Lists each slice's devices as the TPU compiler's topology gives them: [devices, hosts].
TOPOLOGY_PROBE = """
import json, sys
from shardbench.plan.tpu import topology_devices
found = {}
for spec in sys.argv[1:]:
    chip, _, shape = spec.partition(":")
    devices = topology_devices(chip, [int(v) for v in shape.split("x")])
    found[spec] = [len(devices), len({d.process_index for d in devices})]
print(json.dumps(found))
"""


@pytest.mark.skipif(not libtpu_installed(), reason="libtpu is not installed (pip install 'shardbench[tpu]'): the "
                                                   "TPU compiler's topology cannot be listed here")
def test_a_tpu_targets_devices_are_its_topologys() -> None:
    """The mesh a plan compiles is laid over `Target.devices` of the slice's topology: they must be all of them
    (a v3 slice of 4x4 chips is 32 devices to libtpu, on 4 hosts). In a process of its own: libtpu stays out of
    this one."""
    specs = ["tpu-v3:4x4", "tpu-v2:2x2", "tpu-v5e:2x4", "tpu-v4:2x2x2", "tpu-v5e:1x1", "tpu-v5e:1x2"]
    environ = {**os.environ, "JAX_PLATFORMS": "cpu"}
    environ.pop("XLA_FLAGS", None)
    done = subprocess.run([sys.executable, "-c", TOPOLOGY_PROBE, *specs], capture_output=True, text=True,
                          env=environ, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for spec in specs:
        assert found[spec][0] == parse_target(spec).devices, spec
    for spec in ("tpu-v3:4x4", "tpu-v2:2x2"):  # 4 chips, 8 devices, to a host
        assert found[spec][1] == parse_target(spec).nodes, spec
    # A slice within one host (a v5litepod-1) is that host's chips: with hosts of 2x2 chips libtpu refused it.
    assert found["tpu-v5e:1x1"] == [1, 1] and found["tpu-v5e:1x2"] == [2, 1]


def test_the_layout_flags_a_plan_or_tune_does_not_read_are_named() -> None:
    """plan and tune lay out every candidate on every mesh: a --strategy or --mesh given is said to do nothing,
    and so is --devices beside an accelerator target, which gives its own count (a CPU target takes it)."""
    from shardbench.plan.target import ignored_layout_notes, parse_target

    gpu, cpu = parse_target("8xh100", cpu_devices=8), parse_target("cpu", cpu_devices=4)
    given = {"parallel.strategy", "parallel.mesh", "parallel.devices", "model.remat"}
    assert ignored_layout_notes(given, gpu, "tune") == [
        "--strategy does nothing here: tune lays out every candidate strategy on every mesh the target's devices "
        "allow (--candidates names the strategies)",
        "--mesh does nothing here: tune lays out every candidate strategy on every mesh the target's devices allow "
        "(--candidates names the strategies)",
        "--devices does nothing with --target 8xh100: it has 8 device(s)"]
    assert cpu.devices == 4 and ignored_layout_notes({"parallel.devices", "model.remat"}, cpu, "plan") == []


def test_a_gpu_plan_says_it_does_not_model_cudnn_attention_where_auto_would_run_it() -> None:
    """On an NVIDIA GPU `auto` runs cuDNN's attention for the vit and the lm in 16 bits (0.30x lm-seed's step at
    sequence 1024 on an H100), which the planner, compiling elsewhere and fitted to XLA's attention, leaves out: the
    plan says so there, and nowhere else (float32, XLA's attention named, the mlp, another platform)."""
    from shardbench.parsing import override
    from shardbench.plan.build import unmodelled_attention
    from shardbench.presets import get_preset

    lm = override(get_preset("lm-seed"), {"precision.dtype": "bfloat16"})
    said = unmodelled_attention(lm, "gpu")
    assert len(said) == 1 and said[0].startswith("attention: cuDNN's, which --model.attention auto runs for the lm")
    assert unmodelled_attention(override(get_preset("vit-seed"), {"precision.dtype": "bfloat16"}), "gpu")
    for cfg, platform in ((lm, "tpu"), (lm, "cpu"), (get_preset("lm-seed"), "gpu"),
                          (override(lm, {"model.attention": "fused"}), "gpu"), (get_preset("mlp-small"), "gpu")):
        assert unmodelled_attention(cfg, platform) == [], (cfg.preset, platform)


@pytest.mark.parametrize("spec, shape", [("8xtpu-v4", "tpu-v4:2x2x2"), ("8xtpu-v5e", "tpu-v5e:2x4"),
                                         ("2x4xtpu-v6e", "tpu-v6e:2x4"), ("16xtpu-v5p", "tpu-v5p:2x2x4")])
def test_a_tpu_given_as_a_chip_count_is_answered_with_its_own_slice(spec: str, shape: str) -> None:
    """The refusal spelled every TPU as ...:4x4: 16 chips for 8 asked, and 2-D for the v4, whose slices are 3-D
    (itself refused). It names the slice of the chips asked, in the chip's own number of sides, and that is taken."""
    from shardbench.plan.target import parse_target

    with pytest.raises(ConfigError, match=f"give a TPU slice by its topology, e.g. {shape}$"):
        parse_target(spec)
    assert parse_target(shape).devices >= 8


@pytest.mark.parametrize("spec, says", [("tpu-v6e:32x32", "1,024 chips, and a whole tpu-v6e pod holds 256"),
                                        ("tpu-v4:32x16x16", "8,192 chips, and a whole tpu-v4 pod holds 4,096")])
def test_a_slice_larger_than_its_chips_pod_is_refused(spec: str, says: str) -> None:
    """libtpu describes any shape it is given: a 32x32 v6e (four pods) was planned and priced."""
    from shardbench.plan.target import parse_target

    with pytest.raises(ConfigError, match=f"^--target {spec}: {says}: give a slice of at most that many$"):
        parse_target(spec)
    parse_target(spec.split(":")[0] + (":16x16" if "v6e" in spec else ":16x16x16"))


def test_a_target_is_kept_as_it_is_spelt_in_lower_case_without_spaces() -> None:
    """`--target ' 8XH100'` was taken, and its spaces and capitals carried into the plan's folder name and file."""
    from shardbench.plan.target import parse_target

    assert parse_target(" 8XH100 ").spec == "8xh100"
    assert parse_target("TPU-V5E:2x4").spec == "tpu-v5e:2x4" and parse_target(" CPU", 8).spec == "cpu"
