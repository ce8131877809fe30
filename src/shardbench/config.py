"""Typed run configuration: a frozen dataclass for each concern, every field declared once.

Each field is a `fields.setting(default, help, choices=..., range=...)`: the flags and `--help` (`shardbench.flags`),
the validation (`shardbench.validation`) and the docs' flag table (docs/flags.md) read it from there. The named
presets are `shardbench.presets`; text to values is `shardbench.parsing`.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardbench import xla_presets
from shardbench.errors import ConfigError
from shardbench.fields import FRACTION, POSITIVE, POSITIVE_COUNT, Range, Spec, count, setting, spec_of

STRATEGIES = ("auto", "single", "dp", "zero1", "zero2", "fsdp", "tp", "dp+tp", "fsdp+tp", "pp", "dp+pp", "fsdp+pp",
              "pp+tp", "dp+pp+tp", "fsdp+pp+tp", "ep", "dp+ep", "fsdp+ep", "ep+tp", "cp", "dp+cp", "fsdp+cp", "cp+tp")
# How attention sees the keys and values of a sequence split over the seq axis (shardbench.parallel.context), and
# the order its chunks are dealt to the devices (head-tail: device i holds chunks i and 2N-1-i of 2N).
CONTEXT_MODES = ("all-gather", "ring")
CONTEXT_ORDERS = ("head-tail", "contiguous")
# Pipeline schedules (shardbench.parallel.pipeline; 1F1B's hand-written backward in shardbench.train.one_f_one_b).
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "circular")
CIRCULAR_REPEATS = 2  # R of a circular layout the planner or a sweep lays out where --parallel.repeats is 1
DTYPES = ("float32", "bfloat16", "float16")
MATMUL_PRECISIONS = ("default", "high", "highest")
REMAT_POLICIES = ("none", "block", "full")
CROPS = ("resized", "pad")
ERASING_FILLS = ("random", "mean")  # random erasing: normal noise once normalised (timm's 'pixel'), or the mean
SPMD_STYLES = ("jit", "shard_map", "pmap")
ATTENTION = ("auto", "einsum", "fused", "cudnn")
QKV_LAYOUTS = ("auto", "fused", "split", "seq-major")
POOLS = ("cls", "mean", "sequence")
# How the vit turns an image into tokens (models/vit.py): linear patches, CCT's convolutions, SPT's shifted patches.
STEMS = ("patch", "conv", "shifted-patch")
# The built-in model kinds; `shardbench.models.MODELS` holds a builder for each (a test keeps the two equal).
MODEL_KINDS = ("vit", "lm", "mlp")
# Adam's first moment: "" keeps the parameters' dtype (optax's own default), the others force theirs.
MU_DTYPES = ("", "float32", "bfloat16")
OPTIMIZERS = ("adamw", "adam", "sgd")
SCHEDULES = ("cosine", "constant")
# Fields that change where and how a run reports, never what it computes: a resumed run may change them, and
# they are never "what was swept" in a report (sweeps set the first four for every run).
REPORTING_ONLY = frozenset({"train.out", "train.resume", "train.run_name", "train.profile_root", "train.progress",
                            "train.log_every", "train.recalibrate_peak", "train.prices", "data.cache_dir", "preset"})
# What a model of your own (--model FILE:FUNCTION) is trained to do, and the built-in kind whose data, inputs and
# loss that task shares: images or arrays to classes, tokens to next tokens, inputs to values.
TASK_KINDS = {"classify": "vit", "next-token": "lm", "regress": "mlp"}


@dataclass(frozen=True)
class DataConfig:
    """Where images come from and how training images are augmented."""

    dataset: str = setting(
        "synthetic", "dataset: for vit cifar10 (downloaded and md5-checked), cifar10:PATH (local tarball or folder), "
        "imagefolder:PATH (folder or tar of <split>/<class>/<image>: .tar, .tar.gz, .tar.bz2, .tar.xz), synthetic; "
        "for lm tokens-uniform or text:PATH (bytes of a local text file); for mlp regression; for any kind "
        "arrays:PATH.npz", short="--data")
    image_size: int = setting(32, "image side in pixels", range=POSITIVE_COUNT)
    val_fraction: float = setting(
        0.1, "fraction of train held out for validation when the dataset has no val split (45,000/5,000 on "
        "CIFAR-10)", range=FRACTION)
    cache_dir: str = setting(
        "", "where downloads and decoded images are cached ('' = $SHARDBENCH_CACHE or ~/.cache/shardbench)")
    synthetic_train: int = setting(
        50_000, "number of generated training examples (images, sequences or rows of synthetic, tokens-uniform, "
        "regression)", range=POSITIVE_COUNT)
    synthetic_test: int = setting(10_000, "number of generated test examples", range=POSITIVE_COUNT)
    augment: bool = setting(True, "random flip and crop on training images")
    flip: bool = setting(True, "random horizontal flip (with --data.augment)")
    crop_scale: tuple[float, float] = setting(
        (0.9, 1.0), "random resized crop: range of the crop's area fraction, LOW,HIGH with 0 < LOW <= HIGH <= 1")
    crop_ratio: tuple[float, float] = setting(
        (0.9, 1.1), "random resized crop: range of the crop's aspect ratio, LOW,HIGH with 0 < LOW <= HIGH")
    crop: str = setting(
        "resized", "training crop: resized (RandomResizedCrop by --data.crop-scale and --data.crop-ratio) or pad (a "
        "random crop of the image padded with --data.crop-pad zeros)", choices=CROPS)
    crop_pad: int = setting(4, "pixels of zeros around the image for --data.crop pad", range=count(0))
    trivial_augment: bool = setting(
        False, "TrivialAugment: one colour or geometric op per training image at a random magnitude")
    mixup: float = setting(
        0.0, "mix the two images of each pair with a Beta(alpha, alpha) weight (and their labels alike); 0 = off",
        range=Range(0, note="0 = no mixing"))
    cutmix: float = setting(
        0.0, "with --data.mixup: the probability that a pair is cut-mixed (a box pasted) rather than blended",
        range=Range(0, 1))
    mix_prob: float = setting(
        1.0, "with --data.mixup: the probability that a pair is mixed at all (the rest train on their own images and "
        "labels)", range=Range(0, 1, low_open=True))
    mix_until: float = setting(
        1.0, "with --data.mixup: mix only during this first fraction of the training steps (0.6: off for the last "
        "40%); 1 = throughout", range=Range(0, 1, low_open=True, note="1 = throughout"))
    randaugment: int = setting(
        0, "RandAugment: N ops per training image, each drawn uniformly from 14 (identity, shears, translations, "
        "rotate, brightness, saturation, contrast, sharpness, posterize, solarize, autocontrast, equalize); 0 = off. "
        "One op policy at a time (trivial, rand or auto)", range=count(0, note="0 = off"))
    randaugment_magnitude: float = setting(
        9.0, "RandAugment's M: every op at M/30 of its strongest setting (torchvision's scale; timm's rand-m9 is 27 "
        "here)", range=Range(0, 30))
    autoaugment: bool = setting(
        False, "AutoAugment's CIFAR-10 policy: per training image one of its 25 sub-policies, each of two ops "
        "applied with its probability at its level")
    random_erasing: float = setting(
        0.0, "the probability that a random box (2-33% of the image, aspect 0.3-3.3) of each training image is "
        "erased, after the ops and before mixing; 0 = off", range=Range(0, 1, note="0 = off"))
    erasing_fill: str = setting(
        "random", "what an erased box holds: random (a standard normal per pixel once normalised, as timm's 'pixel' "
        "mode) or mean (the dataset's mean: 0 once normalised)", choices=ERASING_FILLS)
    repeat_augment: int = setting(
        1, "repeated augmentation: each training batch holds batch/k distinct images, each k times with different "
        "draws; an epoch is one pass over the distinct images (k times the steps); 1 = off",
        range=count(1, note="1 = off"))


@dataclass(frozen=True)
class ModelConfig:
    """Which model (`kind`) and its shape. Fields a kind does not use are ignored by it:
    vit uses patch_size, embed_dim, num_layers, num_heads, mlp_dim, num_classes, and its own stem, stem_layers,
    pool and lsa (refused for the other kinds);
    lm uses vocab_size, seq_len, embed_dim, num_layers, num_heads, mlp_dim, and with num_experts > 0 top_k,
    capacity_factor and aux_loss_coef (a mixture of experts in place of each block's MLP);
    mlp uses input_dim, mlp_dim (the width), num_layers (hidden layers) and num_classes (outputs)."""

    kind: str = setting(
        "vit", "model: vit (Vision Transformer), lm (decoder-only Transformer language model) or mlp (deep ReLU "
        "MLP)", choices=MODEL_KINDS)
    patch_size: int = setting(4, "patch side in pixels", range=POSITIVE_COUNT)
    embed_dim: int = setting(384, "model width", range=POSITIVE_COUNT)
    num_layers: int = setting(6, "Transformer blocks, or the MLP's ReLU layers", range=POSITIVE_COUNT)
    num_heads: int = setting(8, "attention heads", range=POSITIVE_COUNT)
    mlp_dim: int = setting(1536, "hidden width of each MLP block (the MLP model's width)", range=POSITIVE_COUNT)
    num_classes: int = setting(10, "output classes (the MLP's outputs)", range=POSITIVE_COUNT)
    dropout: float = setting(0.1, "dropout rate after the MLP's activation and output", range=FRACTION,
                             short="--dropout")
    drop_path: float = setting(
        0.0, "stochastic depth: the probability that the last block's residual branches are dropped for an example "
        "(linear from 0 at the first block); 0 = off", range=FRACTION)
    unroll: int = setting(
        0, "layers per scan iteration: 1 = rolled loop (compile time flat in depth), N = N layers per iteration, "
        "0 = auto (all layers up to 8 without --remat, else 1)", range=count(0, note="0 = auto"))
    remat: str = setting(
        "none", "activation checkpointing per block: none, block (keep matmul outputs, recompute the element-wise "
        "ops) or full (keep only each block's input)", choices=REMAT_POLICIES, short="--remat")
    attention: str = setting(
        "auto", "attention kernel: einsum (two einsums, float32 scores), fused (jax.nn.dot_product_attention with "
        "no implementation: XLA's composition), cudnn (cuDNN's fused kernel on a sequence padded to "
        "--model.attention-pad-multiple; NVIDIA GPUs, bfloat16 or float16) or auto (on an NVIDIA GPU: cudnn for the "
        "vit and the lm where cuDNN takes their dtype and head dim, else fused; einsum elsewhere, and einsum with "
        "--model.lsa)",
        choices=ATTENTION)
    # 8: jax's check (check_is_flash_attention) asks training for even lengths, and 8 leaves a margin (the why is
    # at models.transformer.padded_attention); 64 (cuDNN's tile) is the other length the GPU suite measured: on an
    # H100, vit-seed bfloat16 b1024 ran 31.41 ms a step at 8 (72 tokens), 33.28 at 64 (128 tokens), 2026-11-26.
    attention_pad_multiple: int = setting(
        8, "cuDNN's attention (--model.attention cudnn, or auto where it runs cudnn): pad the sequence to a multiple "
        "of this (65 tokens: 72 for 8, 128 for 64); the padding is masked by sequence lengths and sliced off",
        range=POSITIVE_COUNT)
    qkv_layout: str = setting(
        "auto", "q/k/v projection, from the same parameter: fused (one einsum to [3, batch, seq, heads, dim]), "
        "split (three einsums), seq-major (one einsum to [batch, seq, 3, heads, dim]; the last two avoid the "
        "backward's [3, heads, dim, batch, seq] transpose) or auto (seq-major for the vit and the lm where their "
        "attention runs cudnn and no cp strategy splits the sequence, else fused)", choices=QKV_LAYOUTS)
    pool: str = setting(
        "cls", "vit: what the head sees: cls (the class token, the seed's model), mean (the mean of the patch tokens "
        "after the final LayerNorm) or sequence (CCT's sequence pooling: a linear layer scores each token after the "
        "final LayerNorm, the head sees their softmax-weighted sum); mean and sequence have no class token",
        choices=POOLS)
    stem: str = setting(
        "patch", "vit: how an image becomes tokens: patch (a linear projection of each --model.patch-size patch), "
        "conv (Compact Convolutional Transformer's tokenizer: per layer a 3x3 convolution without bias, ReLU and a "
        "3x3 max-pool of stride 2; (image/2)^2 tokens for one layer) or shifted-patch (Shifted Patch Tokenization: "
        "the image and its four diagonal shifts by half a patch, split into patches, each LayerNormed and "
        "projected)", choices=STEMS)
    stem_layers: int = setting(
        1, "vit, --model.stem conv: convolution layers (1 for CCT-x/3x1, 2 for CCT-x/3x2); each halves the image "
        "side, the ones before the last have 64 channels", range=POSITIVE_COUNT)
    lsa: bool = setting(
        False, "vit: Locality Self-Attention (SPT/LSA): each head's softmax scale a learned parameter (from "
        "1/sqrt(head dim)) and no token attending to itself; einsum attention only")
    vocab_size: int = setting(512, "lm: vocabulary size (256 for text:PATH, which is byte-level)", range=POSITIVE_COUNT)
    seq_len: int = setting(
        64, "lm: tokens the model reads per sequence (each example holds seq_len + 1 tokens)", range=POSITIVE_COUNT)
    input_dim: int = setting(1024, "mlp: input features", range=POSITIVE_COUNT)
    num_experts: int = setting(
        0, "lm: experts per block, each a GELU MLP of --model.mlp-dim that replaces the dense MLP (a mixture of "
        "experts, lm-moe); 0 = the dense MLP", range=count(0, note="0 = dense"))
    top_k: int = setting(1, "lm with experts: experts each token is routed to (its k most probable)",
                         range=POSITIVE_COUNT)
    capacity_factor: float = setting(
        1.25, "lm with experts: each expert takes ceil(factor x tokens x top_k / experts) tokens of each sequence; "
        "the rest are dropped (their residual passes the block unchanged) and counted", range=POSITIVE)
    aux_loss_coef: float = setting(
        0.01, "lm with experts: weight of the load-balancing loss (Switch's E x sum_e f_e P_e per block, summed over "
        "blocks) added to the training objective", range=Range(0))
    factory: str = setting(
        "", "a model of your own: FILE.py:FUNCTION or package.module:FUNCTION, FUNCTION(cfg, rngs) returning an nnx "
        "module (see docs/own-model.md)", short="--model")
    task: str = setting(
        "", "with --model: what it is trained to do (sets --model.kind to the kind that shares its data; '' = no "
        "model of your own)", choices=("", *TASK_KINDS), short="--task")
    mode_argument: str = setting(
        "", "with --model: the __call__ keyword that says train or evaluate (e.g. train, deterministic)")


@dataclass(frozen=True)
class ParallelConfig:
    """Device mesh and the strategy that maps logical axes onto it."""

    strategy: str = setting(
        "auto", "how parameters, gradients, optimizer state and batches are split (zero1/zero2: optimizer state, "
        "and gradients too, over data; pp: stacked layers in pipeline stages over stage, combined with dp, fsdp and tp "
        "as dp+pp, fsdp+pp, pp+tp, dp+pp+tp; ep: a mixture's experts over expert, tokens dispatched by all-to-all, as "
        "ep, dp+ep, fsdp+ep, ep+tp; cp: the sequence split over seq, as dp+cp, fsdp+cp, cp+tp); auto: the plainest "
        "strategy that uses every axis the mesh splits (single for --mesh none, dp for data, tp for model, dp+tp for "
        "both, pp for stage, dp+pp, pp+tp, dp+pp+tp, ep for expert, dp+ep, cp for seq, dp+cp, cp+tp)",
        choices=STRATEGIES, short="--strategy")
    mesh: str = setting(
        "", "device mesh: N (all on the strategy's axis), AxB (data x model), name=N,... over data, stage, model, "
        "expert and seq (data=2,stage=4), or none (one device, no mesh); '' = every device on the strategy's axis",
        short="--mesh")
    devices: int = setting(
        0, "devices to use (0 = all); without accelerators, simulates N CPU devices",
        range=count(0, note="0 = every device"), short="--devices")
    spmd: str = setting(
        "jit", "SPMD style: jit (automatic partitioning), shard_map (explicit per-device program with written-out "
        "collectives) or pmap (replicated parameters, data parallelism only)", choices=SPMD_STYLES, short="--spmd")
    rules: str = setting(
        "", "NAME=AXIS: map your model's axis NAME onto one of shardbench's logical axes (embed, mlp, heads, kv, "
        "vocab, classes, layers, ...) or none (models/custom.py); repeatable", short="--rules", repeatable=True)
    microbatches: int = setting(
        0, "pp: microbatches each data shard's batch is split into, which flow through the stages one after "
        "another; more of them shrink the pipeline's idle fraction (S-1)/(M+S-1)",
        range=count(0, note="0 = as many as stages"))
    schedule: str = setting(
        "gpipe", "pp: the pipeline schedule (gpipe: every microbatch's forward, then every backward, M microbatches' "
        "activations alive; 1f1b: one forward then one backward per stage after a warm-up, at most S alive; "
        "circular: each stage holds --parallel.repeats chunks of layers and microbatches loop through the stages "
        "that many times, a smaller bubble)", choices=PIPELINE_SCHEDULES)
    repeats: int = setting(
        1, "pp, --parallel.schedule circular: times each microbatch loops through the stages; the stack splits "
        "into stages x repeats chunks, stage s holding chunks s, s+S, s+2S, ...; the bubble is about "
        "(S-1)/(R*M+S-1)", range=count(1))
    context: str = setting(
        "all-gather", "cp: how attention reaches the keys and values of the sequence split over seq (all-gather: "
        "each device gathers every key and value; ring: blocks passed around the seq axis with ppermute, an online "
        "softmax)", choices=CONTEXT_MODES)
    context_order: str = setting(
        "head-tail", "cp: which sequence chunks each device holds (head-tail: chunks i and 2N-1-i of 2N, so "
        "causal attention gives every device as much work; contiguous: chunk i of N)", choices=CONTEXT_ORDERS)
    sequence_parallel: bool = setting(
        False, "tp: split the LayerNorm and dropout regions along the sequence over model (Megatron's sequence "
        "parallelism): an all-gather and a reduce-scatter in place of each all-reduce")


@dataclass(frozen=True)
class PrecisionConfig:
    """Parameter storage dtype, compute dtype and matmul precision (loss and softmax stay float32)."""

    param_dtype: str = setting("float32", "parameter (and optimizer state) dtype", choices=DTYPES,
                               short="--param-dtype")
    dtype: str = setting("float32", "compute dtype of activations and matmuls", choices=DTYPES, short="--dtype")
    matmul_precision: str = setting("default", "matmul precision", choices=MATMUL_PRECISIONS,
                                    short="--matmul-precision")


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer and learning-rate schedule (linear warm-up, then cosine decay to end_lr_fraction * lr)."""

    optimizer: str = setting("adamw", "optimizer (sgd with --optim.momentum)", choices=OPTIMIZERS)
    lr: float = setting(1e-3, "peak learning rate", range=POSITIVE, short="--lr")
    weight_decay: float = setting(0.05, "decoupled weight decay on kernels (adamw)", range=Range(0))
    b1: float = setting(0.9, "Adam beta1", range=FRACTION)
    b2: float = setting(0.999, "Adam beta2", range=FRACTION)
    momentum: float = setting(0.9, "SGD momentum (sgd only)", range=FRACTION)
    warmup_steps: int = setting(
        -1, "linear warm-up steps (-1 = 5% of training)", range=count(-1, note="-1 = 5% of the steps"))
    schedule: str = setting("cosine", "learning-rate schedule after warm-up: cosine decay or constant",
                            choices=SCHEDULES)
    end_lr_fraction: float = setting(0.01, "final learning rate as a fraction of the peak (cosine)",
                                     range=Range(0, 1))
    grad_clip: float = setting(1.0, "clip gradients to this global norm (0 = off)",
                               range=Range(0, note="0 = no clipping"))
    ema: float = setting(
        0.0, "decay of an exponential moving average of the weights, which evaluation then uses (e.g. 0.999); "
        "0 = off", range=FRACTION)
    mu_dtype: str = setting("", "adam/adamw first moment dtype ('' = the parameters' dtype, as optax does)",
                            choices=MU_DTYPES)


@dataclass(frozen=True)
class TrainConfig:
    """Length of training, batch, seed, output directory and side effects."""

    epochs: int = setting(1, "epochs to train", range=count(0, note="used when --steps is 0"), short="--epochs")
    steps: int = setting(0, "train exactly this many steps (overrides --epochs)",
                         range=count(0, note="0 = train by --epochs"), short="--steps")
    batch_size: int = setting(128, "global batch size (split over the data axis)", range=POSITIVE_COUNT,
                              short="--batch-size")
    grad_accum: int = setting(
        1, "gradient accumulation: each update sums the gradients of this many microbatches of --batch-size / N "
        "examples, run one after another (activation memory of one microbatch, the full batch's update); N must "
        "divide the examples per data shard; 1 = off", range=count(1, note="1 = off"))
    eval_batch_size: int = setting(0, "evaluation batch size (0 = --batch-size)",
                                   range=count(0, note="0 = --batch-size"))
    label_smoothing: float = setting(
        0.0, "classification: spread this fraction of each training target evenly over the classes", range=FRACTION)
    seed: int = setting(12, "random seed", range=Range(0, 2**32, high_open=True, note="a 32-bit seed"), short="--seed")
    out: str = setting("", "run directory ('' = runs/<preset>-<strategy>-<time>, a '+' in the strategy written '_')",
                       short="--out")
    resume: bool = setting(False, "continue the run in --out from its last checkpoint", short="--resume")
    checkpoint_every: int = setting(
        500, "save a checkpoint every N steps (and at the end; 0 = only at the end)",
        range=count(0, note="0 = only at the end"))
    keep_checkpoints: int = setting(2, "checkpoints to keep", range=POSITIVE_COUNT)
    log_every: int = setting(50, "steps between scalar logs", range=POSITIVE_COUNT)
    eval: bool = setting(True, "validate each epoch and test at the end")
    progress: bool = setting(True, "show a progress bar (where the output is a terminal)")
    run_name: str = setting(
        "", "name of the run in reports and profiles: one folder name, no path separator, not . or .. ('' = from the "
        "configuration, e.g. mesh_4_2_batch_1024)")
    timing_warmup: int = setting(
        2, "first step intervals left out of the step-time statistics (lowered, with a line saying so, when a run "
        "has too few steps)", range=count(0))
    recalibrate_peak: bool = setting(
        False, "on a CPU, measure the host's matmul peak for MFU afresh (and cache it) instead of using the cached "
        "figure")
    profile: bool = setting(False, "record a jax.profiler trace of a window of steps", short="--profile")
    profile_skip: int = setting(5, "steps to run before the traced window", range=count(0))
    profile_steps: int = setting(3, "steps in the traced window", range=count(0))
    compile_cache: str = setting(
        "", "persistent compilation cache: '' = <data cache dir>/xla (~/.cache/shardbench/xla), 'off', or a "
        "directory")
    profile_root: str = setting(
        "", "TensorBoard log dir for traces ('' = <out>/tensorboard); a trace lands in "
        "<root>/plugins/profile/<run-name>/")
    prices: str = setting(
        "", "price table (TOML) for the dollars and kWh per epoch in the run record, plan and report ('' = "
        "shardbench's prices.toml; docs/cost.md)", short="--prices")
    # The choices are the option sets shardbench.xla_presets names; each item stands for XLA flags.
    xla_presets: str = setting(
        "", "comma list of named XLA compiler option sets put into XLA_FLAGS before JAX starts; the flags the run "
        "used are in its record", choices=tuple(xla_presets.PRESETS), comma_list=True)

    @property
    def eval_batch(self) -> int:
        """The batch evaluation reads: --train.eval-batch-size, else --batch-size."""
        return self.eval_batch_size or self.batch_size


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
SECTION_TYPES: dict[str, type] = {s: type(getattr(Config(), s)) for s in SECTIONS}


def field_types(section: type) -> dict[str, Any]:
    """Resolved type of every field of a section dataclass (annotations are strings here)."""
    hints = typing.get_type_hints(section)
    return {f.name: hints[f.name] for f in dataclasses.fields(section)}


def declarations() -> dict[str, tuple[Any, Any, Spec]]:
    """{'section.field': (type, default, declaration)} for every field, in the sections' order."""
    found: dict[str, tuple[Any, Any, Spec]] = {}
    for section, kind in SECTION_TYPES.items():
        types = field_types(kind)
        for f in dataclasses.fields(kind):
            found[f"{section}.{f.name}"] = (types[f.name], f.default, spec_of(f))
    return found


SPECS: dict[str, Spec] = {key: spec for key, (_, _, spec) in declarations().items()}
# The range of every numeric field, as declared; `shardbench.validation.check_ranges` checks them all.
RANGES: dict[str, Range] = {key: spec.range for key, spec in SPECS.items() if spec.range is not None}


def unknown_field(key: str) -> ConfigError:
    """The one line for a 'section.field' key no section declares, with the field it was likely meant to be: the
    one whose short flag it spells ('strategy' for parallel.strategy), or one a typo away ('train.stepz')."""
    spelled = key.strip().lstrip("-").replace("_", "-")
    meant = [k for k, spec in SPECS.items() if spec.short and spec.short.lstrip("-") == spelled]
    meant = meant or difflib.get_close_matches(key.replace("-", "_"), list(SPECS), n=1, cutoff=0.8)
    hint = f" (did you mean '{meant[0]}'?)" if meant else ""
    return ConfigError(f"unknown configuration field '{key}'{hint}: see 'shardbench train --help'")


def flag_name(key: str) -> str:
    """The flag a message names for a field: its short spelling where it has one, else --section.field."""
    return SPECS[key].short or "--" + key.replace("_", "-")


def check_choice(key: str, value: Any) -> None:
    """One line, naming the flag and its declared choices, when `value` is not one of them."""
    refusal = SPECS[key].refusal(flag_name(key), value)
    if refusal:
        raise ConfigError(refusal)


def flatten(cfg: Config) -> dict[str, Any]:
    """{'section.field': value} for every field: what differs between two runs is easy to name."""
    return {f"{s}.{k}": v for s in SECTIONS for k, v in dataclasses.asdict(getattr(cfg, s)).items()}


def cache_root(cfg: Config) -> Path:
    """Where decoded datasets, compiled programs and the host's peak are cached: --data.cache-dir, else
    $SHARDBENCH_CACHE, else ~/.cache/shardbench."""
    if cfg.data.cache_dir:
        return Path(cfg.data.cache_dir).expanduser()
    return Path(os.environ.get("SHARDBENCH_CACHE", Path.home() / ".cache" / "shardbench")).expanduser()


def cache_root_flag(cfg: Config) -> str:
    """What a message names for `cache_root`'s folder: --data.cache-dir where it was given (or is the default to
    change), $SHARDBENCH_CACHE where the environment chose it."""
    return "$SHARDBENCH_CACHE" if not cfg.data.cache_dir and "SHARDBENCH_CACHE" in os.environ else "--data.cache-dir"
