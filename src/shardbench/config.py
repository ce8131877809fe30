"""Typed run configuration: frozen dataclasses for each concern, and the named presets.

A preset is a function that returns a `Config`; an experiment derives from a preset with
`dataclasses.replace` (or `override`), never by editing globals.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardbench import xla_presets
from shardbench.errors import ConfigError

STRATEGIES = ("auto", "single", "dp", "fsdp", "tp", "dp+tp", "fsdp+tp")
DTYPES = ("float32", "bfloat16", "float16")
MATMUL_PRECISIONS = ("default", "high", "highest")
REMAT_POLICIES = ("none", "block", "full")
CROPS = ("resized", "pad")
ERASING_FILLS = ("random", "mean")  # random erasing: normal noise once normalised (timm's 'pixel'), or the mean
SPMD_STYLES = ("jit", "shard_map", "pmap")
ATTENTION = ("auto", "einsum", "fused", "cudnn")
QKV_LAYOUTS = ("fused", "split", "seq-major")
POOLS = ("cls", "mean", "sequence")
# How the vit turns an image into tokens (models/vit.py): linear patches, CCT's convolutions, SPT's shifted patches.
STEMS = ("patch", "conv", "shifted-patch")
# Adam's first moment: "" keeps the parameters' dtype (optax's own default), the others force theirs.
MU_DTYPES = ("", "float32", "bfloat16")
# What cuDNN's fused attention takes (jax._src.cudnn.fused_attention_stablehlo.check_is_flash_attention): a
# compute dtype of 16 bits and a head dim that is a multiple of 8, at most 256 (Hopper and later; 128 before).
CUDNN_DTYPES = ("bfloat16", "float16")
CUDNN_MAX_HEAD_DIM = 256
OPTIMIZERS = ("adamw", "adam", "sgd")
SCHEDULES = ("cosine", "constant")
# Fields that change where and how a run reports, never what it computes: a resumed run may change them, and
# they are never "what was swept" in a report (sweeps set the first four for every run).
REPORTING_ONLY = frozenset({"train.out", "train.resume", "train.run_name", "train.profile_root", "train.progress",
                            "train.log_every", "train.recalibrate_peak", "data.cache_dir", "preset"})
# What a model of your own (--model FILE:FUNCTION) is trained to do, and the built-in kind whose data, inputs and
# loss that task shares: images or arrays to classes, tokens to next tokens, inputs to values.
TASK_KINDS = {"classify": "vit", "next-token": "lm", "regress": "mlp"}


@dataclass(frozen=True)
class DataConfig:
    """Where images come from and how training images are augmented."""

    dataset: str = "synthetic"  # images: cifar10[:PATH] | imagefolder:PATH | synthetic; tokens-uniform | text:PATH; regression
    image_size: int = 32
    val_fraction: float = 0.1  # carved from train when the dataset has no val split (45,000/5,000 on CIFAR-10)
    cache_dir: str = ""  # '' = $SHARDBENCH_CACHE or ~/.cache/shardbench
    synthetic_train: int = 50_000  # examples (images, sequences or rows) of the generated datasets
    synthetic_test: int = 10_000
    augment: bool = True
    flip: bool = True
    crop_scale: tuple[float, float] = (0.9, 1.0)
    crop_ratio: tuple[float, float] = (0.9, 1.1)
    crop: str = "resized"  # resized (RandomResizedCrop: crop_scale, crop_ratio) | pad (crop_pad zeros, random crop)
    crop_pad: int = 4  # pixels of zeros around the image for crop=pad
    trivial_augment: bool = False  # one colour or geometric op per image at a random magnitude
    mixup: float = 0.0  # Beta(alpha, alpha) weight for mixing the images of a pair; 0 = no mixing
    cutmix: float = 0.0  # with mixup > 0: the probability that a pair is cut-mixed rather than blended
    mix_prob: float = 1.0  # with mixup > 0: the probability that a pair is mixed at all
    mix_until: float = 1.0  # with mixup > 0: mix only in this first fraction of the training steps; 1 = throughout
    randaugment: int = 0  # RandAugment: ops per image (N), all at --data.randaugment-magnitude; 0 = off
    randaugment_magnitude: float = 9.0  # RandAugment's M in [0, 30] (torchvision's scale; timm's m9 is 27 here)
    autoaugment: bool = False  # AutoAugment's CIFAR-10 policy: one of 25 learned pairs of ops per image
    random_erasing: float = 0.0  # the probability that a random box of each training image is erased; 0 = off
    erasing_fill: str = "random"  # what an erased box holds: random (normal noise once normalised) | mean
    repeat_augment: int = 1  # each training image k times per batch, differently augmented (B/k distinct images)


@dataclass(frozen=True)
class ModelConfig:
    """Which model (`kind`) and its shape. Fields a kind does not use are ignored by it:
    vit uses patch_size, embed_dim, num_layers, num_heads, mlp_dim, num_classes, and its own stem, stem_layers,
    pool and lsa (refused for the other kinds);
    lm uses vocab_size, seq_len, embed_dim, num_layers, num_heads, mlp_dim;
    mlp uses input_dim, mlp_dim (the width), num_layers (hidden layers) and num_classes (outputs)."""

    kind: str = "vit"  # vit | lm | mlp
    patch_size: int = 4
    embed_dim: int = 384
    num_layers: int = 6
    num_heads: int = 8
    mlp_dim: int = 1536
    num_classes: int = 10
    dropout: float = 0.1
    drop_path: float = 0.0  # stochastic depth: the last block's rate (linear from 0 at the first); 0 = off
    unroll: int = 0  # layers per scan iteration: 1 = a rolled loop (compile time flat in depth); 0 = auto
    remat: str = "none"  # activation checkpointing per block: none | block (recompute element-wise ops) | full
    attention: str = "auto"  # einsum | fused (jax.nn.dot_product_attention) | cudnn | auto: fused on GPUs, else einsum
    # cudnn: the sequence is padded to a multiple of this (65 tokens -> 72), the padding masked by sequence lengths.
    # 8: jax's check (check_is_flash_attention) asks training for even lengths, and 8 leaves a margin (the why is
    # at models.transformer.padded_attention); 64 (cuDNN's tile) is the other length the GPU suite measures.
    attention_pad_multiple: int = 8
    qkv_layout: str = "fused"  # q/k/v projection: fused (one einsum to [3,b,s,h,d]) | split (three) | seq-major
    pool: str = "cls"  # vit: cls (class token, the seed's model) | mean (mean of the patch tokens, no class token)
    # | sequence (CCT's sequence pooling: a learned softmax weighting of the tokens, no class token)
    stem: str = "patch"  # vit tokenizer: patch (linear patches) | conv (CCT's conv + ReLU + max-pool) | shifted-patch
    stem_layers: int = 1  # vit, stem conv: conv layers, each halving the side (CCT-x/3x1: 1, /3x2: 2)
    lsa: bool = False  # vit: locality self-attention (SPT/LSA): learned per-head softmax scale, no self-attention
    vocab_size: int = 512  # lm: tokens
    seq_len: int = 64  # lm: tokens the model reads per sequence (each example holds seq_len + 1 tokens)
    input_dim: int = 1024  # mlp: input features
    factory: str = ""  # a model of your own: FILE.py:FUNCTION or package.module:FUNCTION (see models/custom.py)
    task: str = ""  # with factory: classify | next-token | regress (sets kind to the kind that shares its data)
    mode_argument: str = ""  # with factory: the __call__ keyword that says train or evaluate (train, deterministic)


@dataclass(frozen=True)
class ParallelConfig:
    """Device mesh and the strategy that maps logical axes onto it."""

    strategy: str = "auto"  # auto: single for --mesh none, dp for a data-only mesh, tp model-only, dp+tp both
    mesh: str = ""  # '' = every device on the strategy's axis; 'none' = one device; '8', '4x2' (data x model), 'data=4,model=2'
    devices: int = 0  # 0 = every device; on a CPU-only machine N simulates N devices
    spmd: str = "jit"  # jit (automatic partitioning) | shard_map (explicit per-device program) | pmap
    rules: str = ""  # NAME=AXIS,...: a model's own axis names onto shardbench's logical axes (models/custom.py)


@dataclass(frozen=True)
class PrecisionConfig:
    """Parameter storage dtype, compute dtype and matmul precision (loss and softmax stay float32)."""

    param_dtype: str = "float32"
    dtype: str = "float32"
    matmul_precision: str = "default"


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer and learning-rate schedule (linear warm-up, then cosine decay to end_lr_fraction * lr)."""

    optimizer: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.05
    b1: float = 0.9
    b2: float = 0.999
    momentum: float = 0.9  # sgd only
    warmup_steps: int = -1  # -1 = 5% of the training steps
    schedule: str = "cosine"
    end_lr_fraction: float = 0.01
    grad_clip: float = 1.0  # global-norm clipping; 0 turns it off
    ema: float = 0.0  # decay of an exponential moving average of the weights, evaluated instead of them; 0 = off
    mu_dtype: str = ""  # adam/adamw first moment: '' = the parameters' dtype (as optax does) | float32 | bfloat16


@dataclass(frozen=True)
class TrainConfig:
    """Length of training, batch, seed, output directory and side effects."""

    epochs: int = 1
    steps: int = 0  # > 0: train exactly this many steps, ignoring epochs
    batch_size: int = 128  # global batch
    eval_batch_size: int = 0  # 0 = batch_size
    label_smoothing: float = 0.0  # classification: this much of each target spread evenly over the classes
    seed: int = 12
    out: str = ""  # '' = runs/<preset>-<strategy>-<time>
    resume: bool = False
    checkpoint_every: int = 500  # steps; a checkpoint is also written at the end; 0 = only at the end
    keep_checkpoints: int = 2
    log_every: int = 50  # steps between scalar writes
    eval: bool = True  # validation each epoch and test at the end
    progress: bool = True
    run_name: str = ""  # '' = from the configuration, e.g. mesh_4_2_batch_1024
    timing_warmup: int = 2  # first step intervals left out of the step-time statistics
    recalibrate_peak: bool = False  # CPU: measure the host's matmul peak afresh instead of using the cached one
    profile: bool = False  # record a jax.profiler trace of a window of steps
    profile_skip: int = 5  # steps before the traced window
    profile_steps: int = 3  # steps in the traced window
    compile_cache: str = ""  # persistent compilation cache: '' = <cache dir>/xla, 'off', or a directory
    profile_root: str = ""  # '' = <out>/tensorboard; traces land in <root>/plugins/profile/<run-name>/
    xla_presets: str = ""  # comma list of named XLA compiler option sets (shardbench.xla_presets), put in XLA_FLAGS


@dataclass(frozen=True)
class Config:
    """Everything one run needs; saved as config.json in the run directory."""

    preset: str = "vit-seed"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


SECTIONS: tuple[str, ...] = ("data", "model", "parallel", "precision", "optim", "train")


# ----------------------------------------------------------------------------------------------- presets
def vit_seed() -> Config:
    """The seed posts' ViT: patch 4, embed 384, 6 layers, 8 heads, MLP 1536: 10,695,562 parameters."""
    return Config(preset="vit-seed")


def vit_small() -> Config:
    """Half the seed's width: a fair CPU benchmark that still looks like a ViT."""
    return Config(
        preset="vit-small",
        model=ModelConfig(embed_dim=192, num_layers=6, num_heads=4, mlp_dim=768, dropout=0.0),
    )


def vit_tiny() -> Config:
    """A ViT small enough to train on CIFAR-10 for a few epochs on two CPU cores."""
    return Config(
        preset="vit-tiny",
        model=ModelConfig(embed_dim=128, num_layers=4, num_heads=4, mlp_dim=256, dropout=0.0),
        train=TrainConfig(epochs=3, batch_size=128, checkpoint_every=200),
    )


def vit_cifar() -> Config:
    """vit-seed's model (10.7M parameters) with a recipe for CIFAR-10 accuracy, all on the device: a padded random
    crop and flip, TrivialAugment, mixup or CutMix between pairs, label smoothing and stochastic depth;
    AdamW, cosine, 100 epochs at batch 512 (the GPU target: 90% test accuracy in 5 minutes of training)."""
    return Config(
        preset="vit-cifar",
        data=DataConfig(dataset="cifar10", crop="pad", crop_pad=4, trivial_augment=True, mixup=1.0, cutmix=0.5),
        model=ModelConfig(dropout=0.0, drop_path=0.1),
        optim=OptimConfig(lr=1e-3, weight_decay=0.05, warmup_steps=-1),
        train=TrainConfig(epochs=100, batch_size=512, label_smoothing=0.1, checkpoint_every=2000),
    )


def vit_cifar_spt() -> Config:
    """A candidate beside vit-cifar following the training recipe of the SPT/LSA ViT code (Lee, Lee and Song, 2021,
    "Vision Transformer for Small-Size Datasets": 93.6% on CIFAR-10 with their tokenizer and attention): their
    model, Shifted Patch Tokenization (--model.stem shifted-patch) and Locality Self-Attention (--model.lsa) at
    their ViT's shape (width 192, depth 9, 12 heads, MLP ratio 2, patch 4, a class token: 2,735,062 parameters,
    3.7x fewer FLOPs per image than vit-seed by `vit.flops_per_example`), AdamW lr 1e-3 and weight decay 0.05, 10
    warm-up epochs, cosine, label smoothing 0.1, drop-path 0.1, the padded crop and flip, AutoAugment's CIFAR-10
    policy, random erasing 0.25 filled with the mean (as their RandomErasing), mixup 1.0 / CutMix 1.0 applied to
    half of the pairs (half of those cut), repeated augmentation x3, 100 epochs (their code's default).

    Its length on one H100 is an estimate, not a measurement (no GPU has run this preset): vit-cifar's measured
    ~29,300 images/s (8,700 steps of 512 in 152 s, bfloat16) scaled by FLOPs per image gives ~110,000 images/s (a
    narrow model reaches a lower MFU than vit-cifar's, so the true rate is likely lower). Batch 384 = 128 distinct
    images x 3, 45,000 // 128 = 351 steps per epoch, 100 epochs = 35,100 steps = 13.5M images = about 123 s by that
    estimate, inside the 5-minute budget with room to spare; the warm-up is 10 epochs = 3,510 steps."""
    return Config(
        preset="vit-cifar-spt",
        data=DataConfig(dataset="cifar10", crop="pad", crop_pad=4, autoaugment=True, random_erasing=0.25,
                        erasing_fill="mean", mixup=1.0, cutmix=0.5, mix_prob=0.5, repeat_augment=3),
        model=ModelConfig(embed_dim=192, num_layers=9, num_heads=12, mlp_dim=384, patch_size=4, dropout=0.0,
                          drop_path=0.1, stem="shifted-patch", lsa=True),
        optim=OptimConfig(lr=1e-3, weight_decay=0.05, warmup_steps=3510),
        train=TrainConfig(epochs=100, batch_size=384, label_smoothing=0.1, checkpoint_every=5000),
    )


def vit_cifar_cct() -> Config:
    """A candidate beside vit-cifar following the CIFAR recipe of Compact Transformers (Hassani et al., 2021,
    "Escaping the Big Data Paradigm with Compact Transformers": CCT-7/3x1 94.8%, ViT-Lite-7/4 91.4% in 200 epochs),
    with their model, CCT-7/3x1: the convolutional tokenizer with one layer (--model.stem conv: a 3x3 convolution, ReLU, a 3x3
    max-pool of stride 2, so 16x16 = 256 tokens), sequence pooling (--model.pool sequence), 7 layers of width 256,
    4 heads, MLP ratio 2: 3,765,515 parameters (CCT's 3.76M and the 5,376 q/k/v biases of this ViT's blocks), 1.66x
    the FLOPs per image of vit-seed by `vit.flops_per_example` (256 tokens against 65, at two thirds of the width);
    AdamW lr 5.5e-4 and weight decay 0.06, 10 warm-up epochs, cosine, label smoothing 0.1, drop-path 0.1, the
    padded crop and flip, AutoAugment's CIFAR-10 policy, random erasing 0.25 (timm's noise fill), mixup at alpha 0.8
    with CutMix on half of the pairs (CCT's CutMix alpha is 1.0; here one alpha serves both), and mixing turned off
    for the last 40% of the steps.

    Its length on one H100 is an estimate, not a measurement (no GPU has run this preset): vit-cifar's measured
    ~29,300 images/s (bfloat16) scaled by FLOPs per image gives ~17,600 images/s. Batch 256, 45,000 // 256 = 175
    steps per epoch, 115 epochs = 20,125 steps = 5.15M images = about 292 s by that estimate (CCT's 200 epochs would
    take about 510 s); the warm-up is 10 epochs = 1,750 steps."""
    return Config(
        preset="vit-cifar-cct",
        data=DataConfig(dataset="cifar10", crop="pad", crop_pad=4, autoaugment=True, random_erasing=0.25,
                        mixup=0.8, cutmix=0.5, mix_until=0.6),
        model=ModelConfig(embed_dim=256, num_layers=7, num_heads=4, mlp_dim=512, dropout=0.0, drop_path=0.1,
                          stem="conv", stem_layers=1, pool="sequence"),
        optim=OptimConfig(lr=5.5e-4, weight_decay=0.06, warmup_steps=1750),
        train=TrainConfig(epochs=115, batch_size=256, label_smoothing=0.1, checkpoint_every=5000),
    )


def lm_seed() -> Config:
    """The seed's Transformer LM: vocabulary 512, sequence 64, width 256, 8 heads, 4 layers, MLP 1024,
    batch 32, AdamW 3e-4, 50 steps on 8,192 uniformly random sequences."""
    return Config(
        preset="lm-seed",
        data=DataConfig(dataset="tokens-uniform", synthetic_train=8192, synthetic_test=1024),
        model=ModelConfig(kind="lm", embed_dim=256, num_layers=4, num_heads=8, mlp_dim=1024, dropout=0.0,
                          vocab_size=512, seq_len=64),
        optim=OptimConfig(lr=3e-4, weight_decay=1e-4, schedule="constant", warmup_steps=0, grad_clip=0.0),
        train=TrainConfig(steps=50, batch_size=32, log_every=10, checkpoint_every=0),
    )


def lm_tiny() -> Config:
    """A byte-level LM small enough to learn a text file on two CPU cores in a few hundred steps."""
    return Config(
        preset="lm-tiny",
        data=DataConfig(dataset="tokens-uniform", synthetic_train=4096, synthetic_test=512),
        model=ModelConfig(kind="lm", embed_dim=128, num_layers=2, num_heads=4, mlp_dim=512, dropout=0.0,
                          vocab_size=256, seq_len=64),
        optim=OptimConfig(lr=1e-3, weight_decay=1e-4, warmup_steps=10),
        train=TrainConfig(steps=200, batch_size=32, log_every=20, checkpoint_every=0),
    )


def mlp_seed() -> Config:
    """The seed's deep MLP: 90 ReLU layers of width 2056 on 1024 inputs, 10 outputs, mean squared error,
    Adam 1e-4, batch 256 x 27 = 6,912 (about 380M parameters: a GPU preset)."""
    return Config(
        preset="mlp-seed",
        data=DataConfig(dataset="regression", synthetic_train=6912 * 4, synthetic_test=6912),
        model=ModelConfig(kind="mlp", num_layers=90, mlp_dim=2056, input_dim=1024, num_classes=10, dropout=0.0),
        optim=OptimConfig(optimizer="adam", lr=1e-4, schedule="constant", warmup_steps=0, grad_clip=0.0),
        train=TrainConfig(steps=20, batch_size=6912, log_every=5, checkpoint_every=0),
    )


def mlp_small() -> Config:
    """The seed's MLP scaled for a CPU: 24 ReLU layers of width 512 on 256 inputs, batch 1024."""
    return Config(
        preset="mlp-small",
        data=DataConfig(dataset="regression", synthetic_train=16384, synthetic_test=2048),
        model=ModelConfig(kind="mlp", num_layers=24, mlp_dim=512, input_dim=256, num_classes=10, dropout=0.0),
        optim=OptimConfig(optimizer="adam", lr=1e-4, schedule="constant", warmup_steps=0, grad_clip=0.0),
        train=TrainConfig(steps=20, batch_size=1024, log_every=5, checkpoint_every=0),
    )


PRESETS: dict[str, Callable[[], Config]] = {
    "vit-seed": vit_seed,
    "vit-small": vit_small,
    "vit-tiny": vit_tiny,
    "vit-cifar": vit_cifar,
    "vit-cifar-spt": vit_cifar_spt,
    "vit-cifar-cct": vit_cifar_cct,
    "lm-seed": lm_seed,
    "lm-tiny": lm_tiny,
    "mlp-seed": mlp_seed,
    "mlp-small": mlp_small,
}


def get_preset(name: str) -> Config:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset '{name}': choose one of {', '.join(PRESETS)}")
    return PRESETS[name]()


# --------------------------------------------------------------------------------------------- overrides
def field_types(section: type) -> dict[str, Any]:
    """Resolved type of every field of a section dataclass (annotations are strings here)."""
    hints = typing.get_type_hints(section)
    return {f.name: hints[f.name] for f in dataclasses.fields(section)}


def parse_value(key: str, text: str, kind: Any) -> Any:
    """Turn command-line text into a field's type, or say in one line what would be right."""
    try:
        if kind is bool:
            lowered = text.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        if typing.get_origin(kind) is tuple:
            parts = [float(p) for p in text.split(",")]
            if len(parts) != len(typing.get_args(kind)):
                raise ValueError(text)
            return tuple(parts)
        return str(text)
    except ValueError:
        name = getattr(kind, "__name__", str(kind))
        raise ConfigError(f"--{key.replace('_', '-')}: '{text}' is not a valid {name}") from None


def override(cfg: Config, values: Mapping[str, Any]) -> Config:
    """Apply {'section.field': value} overrides (values already typed or as command-line text)."""
    sections = {name: getattr(cfg, name) for name in SECTIONS}
    preset = cfg.preset
    for key, value in values.items():
        if key == "preset":
            preset = str(value)
            continue
        section, _, name = key.partition(".")
        if section not in sections or name not in field_types(type(sections[section])):
            raise ConfigError(f"unknown configuration field '{key}': see 'shardbench train --help'")
        kind = field_types(type(sections[section]))[name]
        typed = parse_value(key, value, kind) if isinstance(value, str) and kind is not str else value
        if typing.get_origin(kind) is tuple and isinstance(typed, list):
            typed = tuple(typed)
        sections[section] = dataclasses.replace(sections[section], **{name: typed})
    model = sections["model"]
    if model.task in TASK_KINDS and model.kind != TASK_KINDS[model.task]:  # the task decides the data and loss
        sections["model"] = dataclasses.replace(model, kind=TASK_KINDS[model.task])
    return Config(preset=preset, **sections)


def from_dict(data: Mapping[str, Any]) -> Config:
    """Rebuild a Config from its to_dict() form (e.g. a run directory's config.json)."""
    flat = {f"{s}.{k}": v for s in SECTIONS for k, v in data.get(s, {}).items()}
    return override(Config(preset=str(data.get("preset", "vit-seed"))), flat)


def flatten(cfg: Config) -> dict[str, Any]:
    """{'section.field': value} for every field: what differs between two runs is easy to name."""
    return {f"{s}.{k}": v for s in SECTIONS for k, v in dataclasses.asdict(getattr(cfg, s)).items()}


def cache_root(cfg: Config) -> Path:
    """Where decoded datasets, compiled programs and the host's peak are cached: --data.cache-dir, else
    $SHARDBENCH_CACHE, else ~/.cache/shardbench."""
    if cfg.data.cache_dir:
        return Path(cfg.data.cache_dir).expanduser()
    return Path(os.environ.get("SHARDBENCH_CACHE", Path.home() / ".cache" / "shardbench")).expanduser()


@dataclass(frozen=True)
class Range:
    """The values a numeric field takes: low <= value (or low < value), value <= high (or < high)."""

    low: float
    high: float = math.inf
    low_open: bool = False  # the value must be greater than `low`
    high_open: bool = False  # the value must be less than `high`
    note: str = ""  # what a special value means, e.g. "0 = train by --epochs"

    def holds(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def text(self) -> str:
        low = "(" if self.low_open else "["
        high = ")" if self.high_open or math.isinf(self.high) else "]"
        top = "inf" if math.isinf(self.high) else f"{self.high:g}"
        return f"{low}{self.low:g}, {top}{high}" + (f"; {self.note}" if self.note else "")


POSITIVE = Range(0, low_open=True)
FRACTION = Range(0, 1, high_open=True)
# The range of every numeric field, checked in one place (`check_ranges`) and shown in `--help`.
RANGES: dict[str, Range] = {
    "data.image_size": POSITIVE, "data.val_fraction": FRACTION,
    "data.synthetic_train": POSITIVE, "data.synthetic_test": POSITIVE,
    "model.patch_size": POSITIVE, "model.embed_dim": POSITIVE, "model.num_layers": POSITIVE,
    "model.num_heads": POSITIVE, "model.mlp_dim": POSITIVE, "model.num_classes": POSITIVE,
    "model.dropout": FRACTION, "model.drop_path": FRACTION, "data.crop_pad": Range(0),
    "data.mixup": Range(0, note="0 = no mixing"), "data.cutmix": Range(0, 1), "optim.ema": FRACTION,
    "data.mix_prob": Range(0, 1, low_open=True), "data.mix_until": Range(0, 1, low_open=True, note="1 = throughout"),
    "data.randaugment": Range(0, note="0 = off"), "data.randaugment_magnitude": Range(0, 30),
    "data.random_erasing": Range(0, 1, note="0 = off"), "data.repeat_augment": Range(1, note="1 = off"),
    "train.label_smoothing": FRACTION, "model.unroll": Range(0, note="0 = auto"), "model.vocab_size": POSITIVE,
    "model.seq_len": POSITIVE, "model.input_dim": POSITIVE, "model.attention_pad_multiple": POSITIVE,
    "model.stem_layers": POSITIVE,
    "parallel.devices": Range(0, note="0 = every device"),
    "optim.lr": POSITIVE, "optim.weight_decay": Range(0), "optim.b1": FRACTION, "optim.b2": FRACTION,
    "optim.momentum": FRACTION, "optim.warmup_steps": Range(-1, note="-1 = 5% of the steps"),
    "optim.end_lr_fraction": Range(0, 1), "optim.grad_clip": Range(0, note="0 = no clipping"),
    "train.epochs": Range(0, note="used when --steps is 0"), "train.steps": Range(0, note="0 = train by --epochs"),
    "train.batch_size": POSITIVE, "train.eval_batch_size": Range(0, note="0 = --batch-size"),
    "train.seed": Range(0), "train.checkpoint_every": Range(0, note="0 = only at the end"),
    "train.keep_checkpoints": POSITIVE, "train.log_every": POSITIVE, "train.timing_warmup": Range(0),
    "train.profile_skip": Range(0), "train.profile_steps": Range(0),
}


def check_ranges(cfg: Config) -> None:
    """Every numeric field inside its range (`RANGES`): one line naming the flag, the range and the value."""
    for key, allowed in RANGES.items():
        section, _, name = key.partition(".")
        value = getattr(getattr(cfg, section), name)
        if not allowed.holds(float(value)):
            raise ConfigError(f"--{key.replace('_', '-')} must be in {allowed.text()}, got {value}")


SYNTHETIC_DATASETS = ("synthetic", "tokens-uniform", "regression")


def inert_notes(cfg: Config) -> list[str]:
    """One line for each field set away from its preset's value that this configuration never reads, so that a
    setting that does nothing is said rather than silently accepted (nothing is said for a preset of unknown name)."""
    if cfg.preset not in PRESETS:
        return []
    base = flatten(PRESETS[cfg.preset]())
    now = flatten(cfg)
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
        "model.attention_pad_multiple": (m.attention != "cudnn", "it pads the sequence for --model.attention cudnn"),
        "model.qkv_layout": (m.kind == "mlp", "the mlp model has no attention"),
        "optim.mu_dtype": (o.optimizer == "sgd", "it applies to adam and adamw, not sgd"),
    }
    unused["data.randaugment_magnitude"] = (d.randaugment == 0, "it is RandAugment's, and --data.randaugment is 0")
    unused["data.erasing_fill"] = (d.random_erasing == 0, "it fills erased boxes, and --data.random-erasing is 0")
    if not d.augment:
        for name in ("data.flip", "data.crop", "data.trivial_augment", "data.randaugment", "data.autoaugment",
                     "data.random_erasing"):
            unused.setdefault(name, (True, "augmentation is off (--no-data.augment)"))
    return [f"--{key.replace('_', '-')} {now[key]} does nothing here: {why}"
            for key, (inert, why) in unused.items() if inert and now[key] != base.get(key)]


def validate(cfg: Config) -> None:
    """Check every value that can be checked without devices or data; one line per problem. The model
    kind's own shape checks are its task's (`shardbench.tasks.validate` runs both)."""
    m, p, o, t = cfg.model, cfg.precision, cfg.optim, cfg.train
    if cfg.parallel.strategy not in STRATEGIES:
        raise ConfigError(f"unknown strategy '{cfg.parallel.strategy}': choose one of {', '.join(STRATEGIES)}")
    for name, value in (("param-dtype", p.param_dtype), ("dtype", p.dtype)):
        if value not in DTYPES:
            raise ConfigError(f"unknown --{name} '{value}': choose one of {', '.join(DTYPES)}")
    if p.matmul_precision not in MATMUL_PRECISIONS:
        raise ConfigError(
            f"unknown --matmul-precision '{p.matmul_precision}': choose one of {', '.join(MATMUL_PRECISIONS)}"
        )
    if o.optimizer not in OPTIMIZERS:
        raise ConfigError(f"unknown --optim.optimizer '{o.optimizer}': choose one of {', '.join(OPTIMIZERS)}")
    if o.schedule not in SCHEDULES:
        raise ConfigError(f"unknown --optim.schedule '{o.schedule}': choose one of {', '.join(SCHEDULES)}")
    if m.factory and m.task not in TASK_KINDS:
        raise ConfigError(f"--model {m.factory} needs --task: choose one of {', '.join(TASK_KINDS)}"
                          + (f" (not '{m.task}')" if m.task else ""))
    if m.task and not m.factory:
        raise ConfigError(f"--task {m.task} is for a model of your own: give --model FILE.py:FUNCTION too")
    if m.mode_argument and not m.factory:
        raise ConfigError(f"--model.mode-argument {m.mode_argument} is for a model of your own: give --model "
                          f"FILE.py:FUNCTION too")
    if cfg.parallel.spmd not in SPMD_STYLES:
        raise ConfigError(f"unknown --spmd '{cfg.parallel.spmd}': choose one of {', '.join(SPMD_STYLES)}")
    check_ranges(cfg)
    if m.remat not in REMAT_POLICIES:
        raise ConfigError(f"unknown --remat '{m.remat}': choose one of {', '.join(REMAT_POLICIES)}")
    if cfg.data.crop not in CROPS:
        raise ConfigError(f"unknown --data.crop '{cfg.data.crop}': choose one of {', '.join(CROPS)}")
    image_only = {"--data.mixup": cfg.data.mixup > 0, "--data.trivial-augment": cfg.data.trivial_augment,
                  "--data.crop pad": cfg.data.crop != "resized", "--train.label-smoothing": cfg.train.label_smoothing > 0,
                  "--data.randaugment": cfg.data.randaugment > 0, "--data.autoaugment": cfg.data.autoaugment,
                  "--data.random-erasing": cfg.data.random_erasing > 0,
                  "--data.repeat-augment": cfg.data.repeat_augment > 1}
    used = [flag for flag, on in image_only.items() if on]
    if used and m.kind != "vit":
        raise ConfigError(f"{used[0]} applies to image classification (vit or --task classify), not to model kind "
                          f"'{m.kind}': drop it")
    if m.drop_path > 0 and m.kind == "mlp":
        raise ConfigError("--model.drop-path drops Transformer blocks; the mlp model has none: drop it")
    if cfg.data.cutmix > 0 and cfg.data.mixup <= 0:
        raise ConfigError(f"--data.cutmix {cfg.data.cutmix} needs --data.mixup > 0 (the Beta alpha both mixes draw "
                          f"their weight from), e.g. --data.mixup 1.0")
    check_recipe(cfg)
    if m.attention not in ATTENTION:
        raise ConfigError(f"unknown --model.attention '{m.attention}': choose one of {', '.join(ATTENTION)}")
    check_speed_switches(cfg)
    check_vit_options(cfg)
    xla_presets.parse(t.xla_presets)
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


def check_recipe(cfg: Config) -> None:
    """The augmentation recipe's knobs that depend on each other (ranges are `RANGES`'): one op policy at a time,
    mixing knobs only with mixing, a known erasing fill, repeats that divide the batch. One line each."""
    d = cfg.data
    policies = [flag for flag, on in (("--data.trivial-augment", d.trivial_augment),
                                      (f"--data.randaugment {d.randaugment}", d.randaugment > 0),
                                      ("--data.autoaugment", d.autoaugment)) if on]
    if len(policies) > 1:
        raise ConfigError(f"{' and '.join(policies)} are two op policies; an image gets one: keep one of them")
    for flag, value in (("--data.mix-prob", d.mix_prob), ("--data.mix-until", d.mix_until)):
        if value != 1.0 and d.mixup <= 0:
            raise ConfigError(f"{flag} {value} shapes mixing, which is off: add --data.mixup (e.g. 1.0) or drop it")
    if d.erasing_fill not in ERASING_FILLS:
        raise ConfigError(f"unknown --data.erasing-fill '{d.erasing_fill}': choose one of {', '.join(ERASING_FILLS)}")
    k, batch = d.repeat_augment, cfg.train.batch_size
    if k > 1 and (batch % k or batch // k < 2):
        raise ConfigError(f"--data.repeat-augment {k} repeats each image {k} times in a batch: --batch-size {batch} "
                          f"must be a multiple of {k} holding at least 2 distinct images, e.g. {max(2, -(-batch // k)) * k}")


def check_speed_switches(cfg: Config) -> None:
    """The model's and optimizer's speed switches (q/k/v layout, pooling, cuDNN attention, Adam's first-moment
    dtype): each a known choice, on a model that has it, and cuDNN attention only where the configuration alone
    shows it can run (its platform is checked where the model is built: `shardbench.models`). One line each."""
    m, o = cfg.model, cfg.optim
    if m.qkv_layout not in QKV_LAYOUTS:
        raise ConfigError(f"unknown --model.qkv-layout '{m.qkv_layout}': choose one of {', '.join(QKV_LAYOUTS)}")
    if m.pool not in POOLS:
        raise ConfigError(f"unknown --model.pool '{m.pool}': choose one of {', '.join(POOLS)}")
    if o.mu_dtype not in MU_DTYPES:
        raise ConfigError(f"unknown --optim.mu-dtype '{o.mu_dtype}': choose one of "
                          f"{', '.join(d or repr(d) for d in MU_DTYPES)} ('' = the parameters' dtype)")
    if m.pool != "cls" and (m.kind != "vit" or m.factory):
        what = f"a model of your own (--model {m.factory})" if m.factory else f"model kind '{m.kind}'"
        raise ConfigError(f"--model.pool {m.pool} applies to the vit model only, not to {what}: drop it")
    if m.attention == "cudnn" and m.kind in ("vit", "lm") and not m.factory:
        dtype = cfg.precision.dtype
        if dtype not in CUDNN_DTYPES:
            raise ConfigError(f"--model.attention cudnn needs a 16-bit compute dtype, not --dtype {dtype}: add "
                              f"--dtype bfloat16 (or float16), or use --model.attention fused")
        if m.num_heads > 0 and m.embed_dim % m.num_heads == 0:
            head_dim = m.embed_dim // m.num_heads
            if head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
                raise ConfigError(f"--model.attention cudnn needs a head dim (embed dim / heads) that is a multiple "
                                  f"of 8 and at most {CUDNN_MAX_HEAD_DIM}, not {m.embed_dim}/{m.num_heads} = "
                                  f"{head_dim}: change --model.num-heads, or use --model.attention fused")


def check_vit_options(cfg: Config) -> None:
    """The vit's tokenizer and attention options (--model.stem, --model.lsa; --model.pool is
    `check_speed_switches`'): each a known choice, on the built-in vit only, LSA on the einsum attention only.
    One line each."""
    m = cfg.model
    if m.stem not in STEMS:
        raise ConfigError(f"unknown --model.stem '{m.stem}': choose one of {', '.join(STEMS)}")
    used = [flag for flag, on in ((f"--model.stem {m.stem}", m.stem != "patch"), ("--model.lsa", m.lsa)) if on]
    if used and (m.kind != "vit" or m.factory):
        what = f"a model of your own (--model {m.factory})" if m.factory else f"model kind '{m.kind}'"
        raise ConfigError(f"{used[0]} applies to the vit model only, not to {what}: drop it")
    if m.lsa and m.attention in ("fused", "cudnn"):
        raise ConfigError(f"--model.lsa (a learned scale and a masked diagonal in the softmax) runs on the einsum "
                          f"attention only, not --model.attention {m.attention}: use --model.attention einsum (or "
                          f"auto, which takes einsum with --model.lsa)")
    if m.stem == "shifted-patch" and m.patch_size < 2:
        raise ConfigError(f"--model.stem shifted-patch shifts the image by half a patch: --model.patch-size "
                          f"{m.patch_size} has no half; give it 2 or more (e.g. 4)")
