"""Every check of a configuration that needs neither devices nor data, one line per problem: each field against
its declaration (choices and ranges, `config.SPECS`), then the rules between fields; a model's own rules are that
model's (`models.vit.check_options`, `models.transformer.check_cudnn_config`). Also the settings that do nothing.

The models (flax, JAX) are imported by the two functions that ask them, not at the top: a value refused by its
declaration or by a rule between fields is refused before either is imported (`shardbench train --steps -1`).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from shardbench import config as config_lib
from shardbench.config import SPECS, TASK_KINDS, Config, TrainConfig, check_choice, flatten
from shardbench.errors import ConfigError
from shardbench.presets import PRESETS

SYNTHETIC_DATASETS = ("synthetic", "tokens-uniform", "regression")


def check_choices(cfg: Config) -> None:
    """Every field with declared choices holds one of them: one line naming the flag and listing the choices."""
    values = flatten(cfg)
    for key, spec in SPECS.items():
        if spec.choices:
            check_choice(key, values[key])


def check_ranges(cfg: Config) -> None:
    """Every numeric field inside its declared range: one line naming the flag, the range and the value."""
    values = flatten(cfg)
    for key, allowed in config_lib.RANGES.items():
        if not allowed.holds(values[key]):
            raise ConfigError(f"{config_lib.flag_name(key)} must be in {allowed.text()}, got {_shown(values[key])}")


def _shown(value: float) -> str:
    """A value as a refusal quotes it: a number of more than 24 digits by its count of digits."""
    text = str(value)
    return f"a number of {len(text.lstrip('-'))} digits" if isinstance(value, int) and len(text) > 24 else text


def validate(cfg: Config, *, model_rules: bool = True) -> None:
    """Check every value that can be checked without devices or data; one line per problem. The model
    kind's own shape checks are its task's (`shardbench.tasks.validate` runs both). `model_rules=False` leaves out
    the built-in models' own rules, which import the models' modules, and with them flax and JAX (`shardbench
    train` checks so before it decides whether to start itself again, `cli._train_steps`)."""
    m, t = cfg.model, cfg.train
    check_choices(cfg)
    check_ranges(cfg)
    if m.factory and m.task not in TASK_KINDS:
        raise ConfigError(f"--model {m.factory} needs --task: choose one of {', '.join(TASK_KINDS)}")
    if m.task and not m.factory:
        raise ConfigError(f"--task {m.task} is for a model of your own: give --model FILE.py:FUNCTION too")
    if m.mode_argument and not m.factory:
        raise ConfigError(f"--model.mode-argument {m.mode_argument} is for a model of your own: give --model "
                          f"FILE.py:FUNCTION too")
    if cfg.parallel.rules and not m.factory:
        raise ConfigError(f"--rules {cfg.parallel.rules} is for a model of your own (the built-in models name "
                          f"shardbench's axes themselves): give --model FILE.py:FUNCTION too, or drop it")
    image_only = {"--data.mixup": cfg.data.mixup > 0, "--data.cutmix": cfg.data.cutmix > 0,
                  "--data.trivial-augment": cfg.data.trivial_augment,
                  "--data.crop pad": cfg.data.crop != "resized", "--train.label-smoothing": cfg.train.label_smoothing > 0,
                  "--data.randaugment": cfg.data.randaugment > 0, "--data.autoaugment": cfg.data.autoaugment,
                  "--data.random-erasing": cfg.data.random_erasing > 0,
                  "--data.repeat-augment": cfg.data.repeat_augment > 1}
    used = [flag for flag, on in image_only.items() if on]
    if used and m.kind != "vit":
        raise ConfigError(f"{used[0]} applies to image classification (vit or --task classify), not to model kind "
                          f"'{m.kind}': drop it")
    if cfg.precision.param_dtype == "float16" and cfg.optim.optimizer in ("adam", "adamw"):
        raise ConfigError(f"--param-dtype float16 with --optim.optimizer {cfg.optim.optimizer}: Adam's epsilon "
                          f"(1e-8) is 0 in float16 and its second moment underflows, so the first update is NaN "
                          f"(there is no float32 master copy); use --param-dtype bfloat16, float32 parameters with "
                          f"--dtype float16, or --optim.optimizer sgd")
    if m.num_experts and (m.kind != "lm" or m.factory):
        what = f"a model of your own (--model {m.factory})" if m.factory else f"model kind '{m.kind}'"
        raise ConfigError(f"--model.num-experts {m.num_experts} puts a mixture of experts in the lm's blocks, not in "
                          f"{what}: drop it, or use --model.kind lm")
    if m.drop_path > 0 and m.kind == "mlp":
        raise ConfigError("--model.drop-path drops Transformer blocks; the mlp model has none: drop it")
    if cfg.data.cutmix > 0 and cfg.data.mixup <= 0:
        raise ConfigError(f"--data.cutmix {cfg.data.cutmix} needs --data.mixup > 0 (the Beta alpha both mixes draw "
                          f"their weight from), e.g. --data.mixup 1.0")
    check_recipe(cfg)
    check_model_options(cfg, model_rules)
    check_run_name(t.run_name)
    if t.profile and t.profile_steps == 0:
        raise ConfigError("--profile with --train.profile-steps 0 traces nothing: give the window a positive number of "
                          "steps (default 3), or drop --profile")
    if t.epochs <= 0 and t.steps <= 0:
        raise ConfigError("nothing to train: give --epochs or --steps a positive value")
    lo, hi = cfg.data.crop_scale
    if not 0.0 < lo <= hi <= 1.0:
        raise ConfigError(f"--data.crop-scale {lo},{hi} is invalid: it needs 0 < low <= high <= 1")
    lo, hi = cfg.data.crop_ratio
    if not 0.0 < lo <= hi:
        raise ConfigError(f"--data.crop-ratio {lo},{hi} is invalid: it needs 0 < low <= high")


def check_run_name(name: str) -> None:
    """--train.run-name names one folder, `<profile root>/plugins/profile/<run-name>/` (which a trace replaces), and
    the run in reports: a path (absolute, or with a separator), '.', '..' or a blank name would file the trace, and
    remove an earlier one, somewhere else. '' is the configuration's own name (`naming.config_run_name`)."""
    if not name:
        return
    if not name.strip():
        why = "is blank"
    elif Path(name).is_absolute():
        why = "is an absolute path"
    elif "/" in name or "\\" in name:
        why = "holds a path separator (/ or \\)"
    elif name in (".", ".."):
        why = "names a folder, not a run"
    else:
        return
    shown = repr(name) if name != name.strip() else name
    raise ConfigError(f"--train.run-name {shown} {why}: it names one folder under <profile root>/plugins/profile/ "
                      f"and the run in reports; give a plain name such as mesh_4_2_batch_1024, or '' for the "
                      f"configuration's own")


def check_recipe(cfg: Config) -> None:
    """The augmentation recipe's knobs that depend on each other (ranges and choices are declared): one op policy
    at a time, mixing knobs only with mixing, repeats that divide the batch. One line each."""
    d = cfg.data
    policies = [flag for flag, on in (("--data.trivial-augment", d.trivial_augment),
                                      (f"--data.randaugment {d.randaugment}", d.randaugment > 0),
                                      ("--data.autoaugment", d.autoaugment)) if on]
    if len(policies) > 1:
        raise ConfigError(f"{' and '.join(policies)} are two op policies; an image gets one: keep one of them")
    for flag, value in (("--data.mix-prob", d.mix_prob), ("--data.mix-until", d.mix_until)):
        if value != 1.0 and d.mixup <= 0:
            raise ConfigError(f"{flag} {value} shapes mixing, which is off: add --data.mixup (e.g. 1.0) or drop it")
    k, batch = d.repeat_augment, cfg.train.batch_size
    if k > 1 and (batch % k or batch // k < 2):
        raise ConfigError(f"--data.repeat-augment {k} repeats each image {k} times in a batch: --batch-size {batch} "
                          f"must be a multiple of {k} holding at least 2 distinct images, e.g. {max(2, -(-batch // k)) * k}")


def check_model_options(cfg: Config, model_rules: bool = True) -> None:
    """The model options only some models have (the vit's pool, stem and LSA) on a model that has them, then each
    built-in model's own rules (`model_rules`): cuDNN attention's dtype and head dim, the vit's stems and LSA, the
    mlp's depth. One line each."""
    m = cfg.model
    vit_only = [flag for flag, on in ((f"--model.pool {m.pool}", m.pool != "cls"),
                                      (f"--model.stem {m.stem}", m.stem != "patch"), ("--model.lsa", m.lsa)) if on]
    if vit_only and (m.kind != "vit" or m.factory):
        what = f"a model of your own (--model {m.factory})" if m.factory else f"model kind '{m.kind}'"
        raise ConfigError(f"{vit_only[0]} applies to the vit model only, not to {what}: drop it")
    if m.factory or not model_rules:
        return  # a model of your own brings its own attention and rules
    from shardbench.models import mlp, transformer, vit

    if m.attention == "cudnn" and m.kind in ("vit", "lm"):
        transformer.check_cudnn_config(m, cfg.precision.dtype)
    if m.kind == "vit":
        vit.check_options(m)
    if m.kind == "mlp":
        mlp.check_options(m)


def inert_notes(cfg: Config, given: Collection[str] = (), sections: Collection[str] | None = None) -> list[str]:
    """One line for each field that this configuration never reads and that was set away from its preset's value,
    or given at all (`given`: the fields the command line named, 'train.epochs', even at the preset's value), so
    that a setting that does nothing is said rather than silently accepted (nothing is said for a preset of unknown
    name). `sections`: only fields of these sections ('parallel', 'data', ...); None: every one."""
    if cfg.preset not in PRESETS:
        return []
    base = flatten(PRESETS[cfg.preset]())
    now = flatten(cfg)
    return [f"--{key.replace('_', '-')} {now[key]} does nothing here: {why}"
            for key, why in inert_fields(cfg).items()
            if (now[key] != base.get(key) or key in given) and (sections is None or key.split(".")[0] in sections)]


def inert_fields(cfg: Config) -> dict[str, str]:
    """The fields this configuration never reads, each with why: a value there changes nothing the run computes
    (so a resume does not hold it against the run, `rundir.check_resume`)."""
    from shardbench import models

    d, m, o, t = cfg.data, cfg.model, cfg.optim, cfg.train
    unused = {
        "optim.momentum": (o.optimizer != "sgd", f"it applies to --optim.optimizer sgd, not {o.optimizer}"),
        "optim.end_lr_fraction": (o.schedule != "cosine", "it applies to the cosine schedule"),
        "data.crop_pad": (d.crop != "pad", "it applies to --data.crop pad"),
        "data.crop_scale": (d.crop != "resized", "it applies to --data.crop resized"),
        "data.crop_ratio": (d.crop != "resized", "it applies to --data.crop resized"),
        "data.synthetic_train": (d.dataset.split(":")[0] not in SYNTHETIC_DATASETS,
                                 f"it sizes generated data, and --data is {d.dataset}"),
        "data.synthetic_test": (d.dataset.split(":")[0] not in SYNTHETIC_DATASETS,
                                f"it sizes generated data, and --data is {d.dataset}"),
        "train.eval_batch_size": (not t.eval, "evaluation is off (--no-train.eval)"),
        "train.profile_skip": (not t.profile, "it places the --profile window, and --profile is off"),
        "train.profile_steps": (not t.profile, "it sizes the --profile window, and --profile is off"),
        "train.profile_root": (not t.profile, "it says where --profile writes, and --profile is off"),
        "train.epochs": (t.steps > 0, f"--steps {t.steps} decides the length"),
        "model.vocab_size": (m.kind != "lm", f"the {m.kind} model reads no tokens"),
        "model.seq_len": (m.kind != "lm", f"the {m.kind} model reads no token sequences"),
        "model.patch_size": (m.kind != "vit" or m.stem == "conv", f"the {m.kind} model has no patches"
                             if m.kind != "vit" else "--model.stem conv makes its tokens by convolution, not patches"),
        "model.stem_layers": (m.stem != "conv", f"it counts the conv stem's layers, and --model.stem is {m.stem}"),
        "model.input_dim": (m.kind != "mlp", f"the {m.kind} model's input is not a feature vector"),
        "model.attention_pad_multiple": (m.attention != "cudnn" and (m.attention != "auto" or bool(
            models.auto_cudnn_config_problem(cfg))), "it pads the sequence for cuDNN's attention, which this run "
                                                     "never runs (--model.attention cudnn, or auto for the vit or "
                                                     "the lm in 16 bits on an NVIDIA GPU)"),
        "model.qkv_layout": (m.kind == "mlp", "the mlp model has no attention"),
        "model.top_k": (m.num_experts == 0, "it routes tokens to experts, and --model.num-experts is 0"),
        "model.capacity_factor": (m.num_experts == 0, "it sizes the experts, and --model.num-experts is 0"),
        "model.aux_loss_coef": (m.num_experts == 0, "it weighs the experts' balance, and --model.num-experts is 0"),
        "optim.mu_dtype": (o.optimizer == "sgd", "it applies to adam and adamw, not sgd"),
        "optim.weight_decay": (o.optimizer != "adamw", f"only adamw decays the weights, not {o.optimizer}"),
        "optim.b1": (o.optimizer == "sgd", "it is Adam's beta1, and --optim.optimizer is sgd"),
        "optim.b2": (o.optimizer == "sgd", "it is Adam's beta2, and --optim.optimizer is sgd"),
    }
    # One device, whatever --devices counts (the sweeps that set it for every run, single's among them, stay runnable).
    single = cfg.parallel.strategy == "single" or (
        cfg.parallel.strategy == "auto" and cfg.parallel.mesh.strip().lower() in ("none", "single"))
    unused["parallel.devices"] = (single and cfg.parallel.devices > 1,
                                  "strategy single trains on one device and leaves the others idle: use --devices 1, "
                                  f"or a strategy that splits, such as --strategy dp --mesh {cfg.parallel.devices}")
    unused["data.randaugment_magnitude"] = (d.randaugment == 0, "it is RandAugment's, and --data.randaugment is 0")
    unused["data.erasing_fill"] = (d.random_erasing == 0, "it fills erased boxes, and --data.random-erasing is 0")
    if m.kind == "mlp":
        unused.update(_mlp_inert(m.factory))
    elif m.kind == "lm":
        unused.update(_lm_inert(m.factory))
    if not d.augment:
        for name in ("data.flip", "data.crop", "data.crop_scale", "data.crop_ratio", "data.crop_pad",
                     "data.trivial_augment", "data.randaugment", "data.autoaugment", "data.random_erasing"):
            if not unused.get(name, (False, ""))[0]:
                unused[name] = (True, "augmentation is off (--no-data.augment)")
    return {key: why for key, (inert, why) in unused.items() if inert}


def _mlp_inert(factory: str) -> dict[str, tuple[bool, str]]:
    """What the mlp kind never reads: its inputs are feature vectors (no images to size, crop, flip or augment:
    only `tasks.vision` does that), and the built-in mlp has no attention (a model of your own may read any
    --model.* field, so those are said only for the built-in one)."""
    why = "the mlp model's inputs are feature vectors, not images"
    found = {name: (True, why) for name in ("data.image_size", "data.augment", "data.flip", "data.crop",
                                              "data.crop_scale", "data.crop_ratio", "data.crop_pad")}
    if not factory:
        found |= {"model.embed_dim": (True, "the mlp model's width is --model.mlp-dim"),
                  "model.num_heads": (True, "the mlp model has no attention"),
                  "model.attention": (True, "the mlp model has no attention")}
    return found


def _lm_inert(factory: str) -> dict[str, tuple[bool, str]]:
    """What the lm kind never reads: its inputs are token sequences (no images to size, crop, flip or augment:
    only `tasks.vision` does that), and the built-in lm's outputs are --model.vocab-size logits, not classes (a
    model of your own may read any --model.* field, so that is said only for the built-in one)."""
    why = "the lm model's inputs are token sequences, not images"
    found = {name: (True, why) for name in ("data.image_size", "data.augment", "data.flip", "data.crop",
                                              "data.crop_scale", "data.crop_ratio", "data.crop_pad")}
    if not factory:
        found["model.num_classes"] = (True, "the lm model's outputs are --model.vocab-size logits, not classes")
    return found


def check_profile_window(t: TrainConfig, steps_left: int) -> None:
    """--profile traces steps skip+1 .. skip+steps of this invocation: a run with fewer steps, or a window of no
    steps, would trace nothing."""
    if t.profile and t.profile_steps > 0 and steps_left < t.profile_skip + t.profile_steps:
        raise ConfigError(
            f"--profile traces steps {t.profile_skip + 1}-{t.profile_skip + t.profile_steps} (--train.profile-skip "
            f"{t.profile_skip} + --train.profile-steps {t.profile_steps}), but this run has {steps_left} step(s) "
            f"to train: lower them or train at least {t.profile_skip + t.profile_steps} steps")


__all__ = [
    "check_choices", "check_model_options", "check_profile_window", "check_ranges", "check_recipe", "check_run_name",
    "inert_notes", "validate",
]
