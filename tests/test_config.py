"""Configuration: presets, overrides from the command line, validation messages."""

from __future__ import annotations

import argparse
import math
import re

import pytest

from shardbench import config as config_lib
from shardbench.cli import build_parser, config_from_args
from shardbench.flags import given_fields
from shardbench.errors import ConfigError
from shardbench.parsing import from_dict, override
from shardbench.presets import get_preset
from shardbench.tasks import validate
from shardbench.models.spec import describe_model
from shardbench.validation import check_choices, check_ranges, inert_notes


def _param_count(cfg: config_lib.Config) -> int:
    import jax

    spec = describe_model(cfg)
    return sum(math.prod(s.shape) for s in jax.tree.leaves(spec.abstract))


def test_vit_seed_has_the_seed_notebooks_parameter_count() -> None:
    assert _param_count(get_preset("vit-seed")) == 10_695_562


def test_vit_parameter_count_matches_a_hand_count() -> None:
    cfg = get_preset("vit-tiny")
    m, p = cfg.model, cfg.model.patch_size
    e, h = m.embed_dim, m.mlp_dim
    tokens = (cfg.data.image_size // p) ** 2 + 1
    block = 4 * e + (3 * e * e + 3 * e) + (e * e + e) + (e * h + h) + (h * e + e)
    expected = p * p * 3 * e + e + e + tokens * e + m.num_layers * block + 2 * e + e * m.num_classes + m.num_classes
    assert _param_count(cfg) == expected


def test_every_field_has_a_flag_and_short_flags_set_the_same_field() -> None:
    parser = build_parser()
    help_text = parser._subparsers._group_actions[0].choices["train"].format_help()  # type: ignore[union-attr]
    for key in config_lib.flatten(config_lib.Config()):
        assert "--" + key.replace("_", "-") in help_text, key
    args = parser.parse_args(["train", "--preset", "vit-tiny", "--batch-size", "64", "--model.embed-dim", "96",
                              "--strategy", "fsdp", "--mesh", "4x2", "--data.crop-scale", "0.5,1.0", "--no-data.flip",
                              "--resume", "--lr", "3e-4"])
    cfg = config_from_args(args)
    assert cfg.preset == "vit-tiny"
    assert cfg.train.batch_size == 64 and cfg.model.embed_dim == 96 and cfg.model.num_layers == 4
    assert cfg.parallel.strategy == "fsdp" and cfg.parallel.mesh == "4x2"
    assert cfg.data.crop_scale == (0.5, 1.0) and cfg.data.flip is False and cfg.train.resume is True
    assert cfg.optim.lr == pytest.approx(3e-4)
    long_form = config_from_args(parser.parse_args(["train", "--train.batch-size", "64"]))
    assert long_form.train.batch_size == 64


def test_config_round_trips_through_json() -> None:
    cfg = override(get_preset("vit-tiny"), {"data.crop_ratio": "0.8,1.2", "train.steps": "7"})
    import json

    again = from_dict(json.loads(cfg.to_json()))
    assert again == cfg


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"parallel.strategy": "zero"}, "unknown --strategy 'zero': choose one of auto, single, dp,"),
        ({"precision.dtype": "float8"}, "unknown --dtype 'float8'"),
        ({"precision.param_dtype": "int8"}, "unknown --param-dtype 'int8'"),
        ({"precision.matmul_precision": "max"}, "unknown --matmul-precision 'max'"),
        ({"model.num_heads": 5}, "--model.embed-dim 128 is not divisible by --model.num-heads 5"),
        ({"model.patch_size": 5}, "--data.image-size 32 is not divisible by --model.patch-size 5"),
        ({"train.batch_size": "many"}, "'many' is not a valid int: give one in (0, 2^31)"),
        ({"model.dropout": 1.5}, "--dropout must be in [0, 1), got 1.5"),
        ({"data.crop_scale": "0.5,1.5"}, "--data.crop-scale 0.5,1.5 is invalid"),
        # Adam's epsilon is 0 in float16 and its second moment underflows: the first update was NaN, exit 3.
        ({"precision.param_dtype": "float16"}, "--param-dtype float16 with --optim.optimizer adamw: Adam's epsilon "
                                               "(1e-8) is 0 in float16"),
        ({"precision.param_dtype": "float16", "optim.optimizer": "adam"}, "--param-dtype float16 with "
                                                                          "--optim.optimizer adam:"),
    ],
)
def test_bad_values_are_explained(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(override(get_preset("vit-tiny"), overrides))


def test_float16_parameters_train_with_sgd() -> None:
    validate(override(get_preset("vit-tiny"), {"precision.param_dtype": "float16", "optim.optimizer": "sgd"}))


def test_a_warm_up_past_the_run_is_cut_and_said(micro) -> None:
    """--optim.warmup-steps 50 in a run of 10 steps: the warm-up is cut to 9 steps, so the learning rate reaches
    its peak at the last step (optax counts from 0), and the run's header says so; a warm-up that fits is not
    cut or mentioned."""
    from shardbench.optim import learning_rate, warmup_note

    optim = override(get_preset("vit-tiny"), {"optim.warmup_steps": 50, "optim.lr": 1e-3}).optim
    schedule = learning_rate(optim, 10)
    assert float(schedule(9)) == pytest.approx(1e-3) and float(schedule(1)) == pytest.approx(1e-3 / 9)
    # the preset's value or the user's: said as the warm-up's length, then the flag that sets it
    assert warmup_note(optim, 10) == ("the warm-up of 50 steps (--optim.warmup-steps) is past the run's 10 steps: it "
                                      "is cut to 9, so the learning rate peaks at the last step (and the decay after "
                                      "it never runs)")
    assert warmup_note(optim, 100) == "" and float(learning_rate(optim, 100)(50)) == pytest.approx(1e-3)
    from shardbench.preflight import check_run
    from shardbench.train.console import header_line

    checked = check_run(micro(**{"optim.warmup_steps": 50, "train.steps": 10}))
    assert f" | {warmup_note(checked.cfg.optim, 10)}" in header_line(checked)


@pytest.mark.parametrize("out", ["", "my runs/a (10 steps)"])
def test_the_header_names_the_run_folder_a_launch_reads_back(micro, out: str) -> None:
    """A launch given no --out reads the folder process 0 made from its header, with notes after it."""
    from shardbench.preflight import check_run
    from shardbench.train.console import header_line, out_of_header

    checked = check_run(micro(**{"optim.warmup_steps": 50, "train.steps": 10, "train.out": out}))
    line = header_line(checked)
    assert " | the warm-up of 50 steps" in line  # a note follows the folder
    assert out_of_header(line) == str(checked.out) and str(checked.out).startswith(out or "runs/vit-tiny-")
    assert out_of_header("shardbench: note: 10 steps") is None and out_of_header("epoch 1 (step 5)") is None


def _outside(allowed: config_lib.Range, kind: type) -> list[float]:
    """Values just outside a range (and NaN for a float field)."""
    step = 1 if kind is int else 1e-6
    below = allowed.low if allowed.low_open else allowed.low - step
    values = [below if kind is float else int(below)]
    if not math.isinf(allowed.high):
        values.append(allowed.high if allowed.high_open else allowed.high + step)
    if kind is float:
        values.append(math.nan)
    return values


@pytest.mark.parametrize("key", sorted(config_lib.RANGES))
def test_every_numeric_field_has_a_range_checked_before_anything_runs(key: str) -> None:
    """Each numeric field: a value at its lowest allowed end passes; a value just outside either end (or NaN)
    stops with one line naming the flag and the range; and `--help` shows the range."""
    allowed = config_lib.RANGES[key]
    section, _, name = key.partition(".")
    kind = config_lib.field_types(type(getattr(config_lib.Config(), section)))[name]
    base = override(get_preset("vit-tiny"), {"train.steps": 4})
    lowest = allowed.low + (1 if kind is int else 1e-3) * allowed.low_open
    check_ranges(override(base, {key: kind(lowest)}))
    for value in _outside(allowed, kind):
        with pytest.raises(ConfigError, match=re.escape(f"{config_lib.flag_name(key)} must be in {allowed.text()}")):
            check_ranges(override(base, {key: value}))
    assert f"range {allowed.text()}" in _train_help()


def _train_help() -> str:
    return " ".join(build_parser()._subparsers._group_actions[0].choices["train"].format_help().split())


CHOICE_FIELDS = sorted(key for key, spec in config_lib.SPECS.items() if spec.choices)


@pytest.mark.parametrize("key", CHOICE_FIELDS)
def test_every_choice_field_refuses_a_mistyped_choice_in_one_line_and_help_lists_them(key: str) -> None:
    """A value one letter off a valid choice stops validation with one line naming the flag and every choice
    (before anything compiles), each choice passes the choice check, and `--help` lists them."""
    spec = config_lib.SPECS[key]
    base = override(get_preset("vit-tiny"), {"train.steps": 4})
    typo = spec.choices[-1] + "x"
    with pytest.raises(ConfigError) as err:
        validate(override(base, {key: typo}))
    message = str(err.value)
    assert message.startswith(f"unknown {config_lib.flag_name(key)} '{typo}': choose one of ") and "\n" not in message
    assert all((c or "''") in message for c in spec.choices), message
    for choice in spec.choices:
        check_choices(override(base, {key: choice}))
    # argparse wraps lines at hyphens too ("no-command-\nbuffers"): compare without whitespace
    assert "".join(spec.choices_text().split()) in "".join(_train_help().split()), key


def test_the_declared_model_kinds_are_the_models_shardbench_builds() -> None:
    from shardbench.models import MODELS

    assert tuple(MODELS) == config_lib.MODEL_KINDS


def test_every_field_is_declared_with_help() -> None:
    for key, spec in config_lib.SPECS.items():
        assert spec.help.strip(), key
    assert set(config_lib.SPECS) == set(config_lib.flatten(config_lib.Config()))


def test_unknown_preset_and_field() -> None:
    with pytest.raises(ConfigError, match="unknown preset 'vit-huge'"):
        get_preset("vit-huge")
    with pytest.raises(ConfigError, match="unknown configuration field 'model.width'"):
        override(config_lib.Config(), {"model.width": 3})


def test_settings_the_mlp_or_no_augmentation_never_read_are_noted() -> None:
    """The mlp reads feature vectors (no image to size, crop, flip or augment) and has no attention; with
    --no-data.augment the crop's scale and ratio are read by nothing. Each is one note; the mlp's own fields
    and a model of your own's --model.* fields (its code may read them) are not."""
    mlp = override(get_preset("mlp-small"), {
        "model.embed_dim": 64, "model.num_heads": 2, "model.attention": "einsum", "data.image_size": 64,
        "data.augment": False, "data.flip": False, "data.crop_scale": (0.5, 1.0), "data.crop_ratio": (0.5, 2.0),
        "model.mlp_dim": 64})
    notes = inert_notes(mlp)
    for flag in ("--model.embed-dim 64", "--model.num-heads 2", "--model.attention einsum", "--data.image-size 64",
                 "--data.augment False", "--data.flip False", "--data.crop-scale (0.5, 1.0)",
                 "--data.crop-ratio (0.5, 2.0)"):
        assert sum(note.startswith(f"{flag} does nothing here: the mlp model") for note in notes) == 1, (flag, notes)
    assert not any("mlp-dim" in note.split(":")[0] for note in notes), notes
    own = override(mlp, {"model.factory": "examples/linen_mlp.py:build", "model.task": "regress"})
    assert not any(note.startswith(("--model.embed-dim", "--model.num-heads")) for note in inert_notes(own))
    vit = override(get_preset("vit-tiny"), {"data.augment": False, "data.crop_scale": (0.5, 1.0)})
    assert inert_notes(vit) == ["--data.crop-scale (0.5, 1.0) does nothing here: augmentation is off "
                                "(--no-data.augment)"]
    assert inert_notes(override(get_preset("vit-tiny"), {"data.crop_scale": (0.5, 1.0)})) == []


def _said(notes: list[str], flag: str) -> list[str]:
    return [note for note in notes if note.startswith(f"{flag} ")]


def test_the_optimizers_settings_it_never_reads_are_noted() -> None:
    """optax.adamw alone takes the weight decay (adam and sgd are built without it); b1 and b2 are Adam's and
    AdamW's, never SGD's (`optim.build_optimizer`)."""
    adam = override(get_preset("mlp-small"), {"optim.weight_decay": 0.1, "optim.b1": 0.8, "optim.b2": 0.99})
    assert _said(inert_notes(adam), "--optim.weight-decay") == [
        "--optim.weight-decay 0.1 does nothing here: only adamw decays the weights, not adam"]
    assert not _said(inert_notes(adam), "--optim.b1") and not _said(inert_notes(adam), "--optim.b2")
    sgd = override(adam, {"optim.optimizer": "sgd"})
    assert _said(inert_notes(sgd), "--optim.weight-decay") == [
        "--optim.weight-decay 0.1 does nothing here: only adamw decays the weights, not sgd"]
    assert _said(inert_notes(sgd), "--optim.b1") == [
        "--optim.b1 0.8 does nothing here: it is Adam's beta1, and --optim.optimizer is sgd"]
    assert _said(inert_notes(sgd), "--optim.b2") == [
        "--optim.b2 0.99 does nothing here: it is Adam's beta2, and --optim.optimizer is sgd"]
    adamw = override(adam, {"optim.optimizer": "adamw"})
    assert not [note for note in inert_notes(adamw) if note.startswith(("--optim.weight-decay", "--optim.b"))]


def test_image_settings_on_the_language_model_are_noted() -> None:
    """The lm reads token sequences: no image to size, crop, flip or augment, and its outputs are the vocabulary's
    logits, not --model.num-classes (a model of your own of task next-token may read that field)."""
    lm = override(get_preset("lm-tiny"), {"data.image_size": 64, "model.num_classes": 100, "data.augment": False,
                                          "data.flip": False, "data.crop_scale": (0.5, 1.0)})
    notes = inert_notes(lm)
    for flag in ("--data.image-size 64", "--data.augment False", "--data.flip False", "--data.crop-scale (0.5, 1.0)"):
        assert sum(note.startswith(f"{flag} does nothing here: the lm model's inputs are token sequences")
                   for note in notes) == 1, (flag, notes)
    assert _said(notes, "--model.num-classes") == [
        "--model.num-classes 100 does nothing here: the lm model's outputs are --model.vocab-size logits, not classes"]
    own = override(lm, {"model.factory": "examples/linen_mlp.py:build", "model.task": "next-token"})
    assert not _said(inert_notes(own), "--model.num-classes") and _said(inert_notes(own), "--data.image-size")
    vit = override(get_preset("vit-tiny"), {"data.image_size": 64, "model.num_classes": 100})
    assert inert_notes(vit) == []


def test_epochs_given_to_a_run_by_steps_is_noted_even_at_the_presets_value() -> None:
    """lm-seed trains 50 steps and its epochs are 1: `--epochs 1` does nothing there, and a note says so because
    the command line gave it, not because it differs; where --steps is 0 the epochs decide the length."""
    given = given_fields(build_parser().parse_args(["train", "--preset", "lm-seed", "--epochs", "1"]))
    assert "train.epochs" in given
    lm = get_preset("lm-seed")
    assert inert_notes(lm, given) == ["--train.epochs 1 does nothing here: --steps 50 decides the length"]
    assert inert_notes(lm) == []  # not given, at the preset's value: nothing was asked of it
    vit = get_preset("vit-tiny")
    assert vit.train.steps == 0 and inert_notes(vit, {"train.epochs"}) == []


def test_rules_are_refused_for_a_built_in_model() -> None:
    """--rules maps the axes of a model of your own; the built-in models name shardbench's axes themselves, so it
    is refused there as --model.mode-argument is."""
    with pytest.raises(ConfigError, match=r"^--rules conv_out=mlp is for a model of your own .*give --model "):
        validate(override(get_preset("vit-tiny"), {"parallel.rules": "conv_out=mlp"}))
    validate(override(get_preset("vit-tiny"), {"parallel.rules": "conv_out=mlp",
                                                "model.factory": "examples/convnet.py:build", "model.task": "classify"}))


@pytest.mark.parametrize("command", ["train", "inspect"])
def test_a_flag_the_command_does_not_take_points_to_that_commands_help(command: str,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`shardbench train --checkpoint-every 0` (the flag is --train.checkpoint-every): exit 2, the command's own
    error line and its own --help, before anything runs."""
    from shardbench.cli import main

    with pytest.raises(SystemExit) as stop:
        main([command, "--checkpoint-every", "0"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"shardbench {command}: error: unrecognized arguments: --checkpoint-every 0; did you mean "
        f"--train.checkpoint-every?",
        f"see 'shardbench {command} --help'"]


def test_the_attention_pad_multiple_is_noted_where_no_cudnn_attention_can_run() -> None:
    """--model.attention-pad-multiple pads cuDNN's attention: read with --model.attention cudnn, and with auto
    where auto may pick cuDNN (the vit and the lm in 16 bits, on an NVIDIA GPU); noted as doing nothing for LSA,
    in float32, with an explicit einsum or fused, and for a model of your own."""
    vit = override(get_preset("vit-seed"), {"precision.dtype": "bfloat16", "model.attention_pad_multiple": 64})

    def noted(cfg: config_lib.Config) -> bool:
        return any(note.startswith("--model.attention-pad-multiple 64 does nothing here") for note in inert_notes(cfg))

    assert not noted(vit) and not noted(override(vit, {"model.attention": "cudnn"}))
    for other in ({"precision.dtype": "float32"}, {"model.lsa": True}, {"model.attention": "fused"}):
        assert noted(override(vit, other)), other
    lm = override(get_preset("lm-seed"), {"precision.dtype": "bfloat16", "model.attention_pad_multiple": 64})
    assert not noted(lm) and not noted(override(lm, {"model.attention": "cudnn"}))
    assert noted(override(lm, {"precision.dtype": "float32"}))
    assert noted(override(vit, {"model.factory": "mine:build"}))


def test_sgd_without_momentum_keeps_no_momentum_buffer() -> None:
    """`--optim.momentum 0` is plain SGD: its state holds no buffer of the parameters' size (optax's sgd keeps
    one for momentum=0.0, which inspect and the memory breakdown then counted); with momentum it holds one."""
    import jax
    import numpy as np

    from shardbench.optim import build_optimizer

    params = {"w": np.zeros((100, 10), np.float32), "b": np.zeros(10, np.float32)}

    def state_elements(momentum: float) -> int:
        cfg = config_lib.OptimConfig(optimizer="sgd", momentum=momentum, warmup_steps=0)
        return sum(np.size(leaf) for leaf in jax.tree.leaves(build_optimizer(cfg, 10).init(params)))

    assert state_elements(0.9) - state_elements(0.0) == 100 * 10 + 10  # the buffer, and only it


@pytest.mark.parametrize(("given", "says"), [
    ({"precision.dtype": "float32,float8"}, "unknown --dtype 'float8': choose one of float32, bfloat16, float16"),
    ({"model.remat": "none,most"}, "unknown --remat 'most': choose one of none, block, full (a comma list)"),
    ({"train.batch_size": "64,3000000000"}, "--batch-size must be in (0, 2^31), got 3000000000"),
    ({"train.grad_accum": "2,0"}, "--grad-accum must be in [1, 2^31); 1 = off, got 0"),
    ({"train.grad_accum": "2,-1"}, "--grad-accum '-1' is not a whole number"),
    ({"train.batch_size": " , "}, "--batch-size ' , ': give one value or a comma list"),
])
def test_a_comma_list_of_a_fields_values_is_checked_as_the_field_declares(given: dict[str, str], says: str) -> None:
    """plan and tune take several values of a field where train takes one: each is refused in train's words, from
    the field's own declaration (its choices, or its range for a whole number), not from a check of their own."""
    from shardbench.fields import list_refusal
    from shardbench.flags import comma_lists

    names = {"precision.dtype": "--dtype", "model.remat": "--remat", "train.batch_size": "--batch-size",
             "train.grad_accum": "--grad-accum"}
    with pytest.raises(ConfigError, match=f"^{re.escape(says)}"):
        comma_lists(argparse.Namespace(**given), names)
    # a field of real numbers, as a command of its own might list them
    assert list_refusal("--lr", ["0.1", "x"], range=config_lib.RANGES["optim.lr"]) == (
        "--lr 'x' is not a number: give numbers, comma separated")
    assert list_refusal("--lr", ["0.1", "-1"], range=config_lib.RANGES["optim.lr"]).startswith("--lr must be in (0")
    args = argparse.Namespace(**{"precision.dtype": "bfloat16,float32", "train.batch_size": "64,128"})
    assert comma_lists(args, names) == {"precision.dtype": ["bfloat16", "float32"], "train.batch_size": ["64", "128"]}
    assert (getattr(args, "precision.dtype"), getattr(args, "train.batch_size")) == ("bfloat16", "64")
