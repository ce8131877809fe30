"""Command-line flags for configuration fields: one `--section.field` flag per field (dashes or underscores),
short spellings for the common ones (`--batch-size` for `--train.batch-size`), their help, and the parsed
arguments back into a Config. Shared by `train`, `inspect` and `sweep`.
"""

from __future__ import annotations

import argparse
import typing
from typing import Any

from shardbench import config as config_lib

SHORT_FLAGS: dict[str, str] = {
    "train.profile": "--profile",
    "data.dataset": "--data", "train.epochs": "--epochs", "train.steps": "--steps",
    "train.batch_size": "--batch-size", "parallel.mesh": "--mesh", "parallel.strategy": "--strategy",
    "parallel.devices": "--devices", "precision.param_dtype": "--param-dtype", "precision.dtype": "--dtype",
    "precision.matmul_precision": "--matmul-precision", "model.dropout": "--dropout", "optim.lr": "--lr",
    "train.seed": "--seed", "train.out": "--out", "train.resume": "--resume", "model.remat": "--remat",
    "parallel.spmd": "--spmd", "model.factory": "--model", "model.task": "--task", "parallel.rules": "--rules",
}
REPEATABLE = frozenset({"parallel.rules"})  # given several times, the values join with commas

HELP: dict[str, str] = {
    "data.dataset": "dataset: for vit cifar10 (downloaded and md5-checked), cifar10:PATH (local tarball or "
                    "folder), imagefolder:PATH (folder or .tar/.tar.gz of <split>/<class>/<image>), synthetic; for "
                    "lm tokens-uniform or text:PATH (bytes of a local text file); for mlp regression",
    "data.image_size": "image side in pixels",
    "data.val_fraction": "fraction of train held out for validation when the dataset has no val split",
    "data.cache_dir": "where downloads and decoded images are cached ('' = $SHARDBENCH_CACHE or "
                      "~/.cache/shardbench)",
    "data.synthetic_train": "number of generated training examples (synthetic, tokens-uniform, regression)",
    "data.synthetic_test": "number of generated test examples",
    "data.augment": "random flip and resized crop on training images",
    "data.flip": "random horizontal flip (with --data.augment)",
    "data.crop_scale": "random resized crop: range of the crop's area fraction",
    "data.crop_ratio": "random resized crop: range of the crop's aspect ratio",
    "data.crop": "training crop: resized (RandomResizedCrop by --data.crop-scale and --data.crop-ratio) or pad "
                 "(a random crop of the image padded with --data.crop-pad zeros)",
    "data.crop_pad": "pixels of zeros around the image for --data.crop pad",
    "data.trivial_augment": "TrivialAugment: one colour or geometric op per training image at a random magnitude",
    "data.mixup": "mix the two images of each pair with a Beta(alpha, alpha) weight (and their labels alike); "
                  "0 = off",
    "data.cutmix": "with --data.mixup: the probability that a pair is cut-mixed (a box pasted) rather than "
                   "blended",
    "data.mix_prob": "with --data.mixup: the probability that a pair is mixed at all (the rest train on their own "
                     "images and labels)",
    "data.mix_until": "with --data.mixup: mix only during this first fraction of the training steps (0.6: off for "
                      "the last 40%%); 1 = throughout",
    "data.randaugment": "RandAugment: N ops per training image, each drawn uniformly from 14 (identity, shears, "
                        "translations, rotate, brightness, saturation, contrast, sharpness, posterize, solarize, "
                        "autocontrast, equalize); 0 = off. One op policy at a time (trivial, rand or auto)",
    "data.randaugment_magnitude": "RandAugment's M in [0, 30]: every op at M/30 of its strongest setting "
                                  "(torchvision's scale; timm's rand-m9 is 27 here)",
    "data.autoaugment": "AutoAugment's CIFAR-10 policy: per training image one of its 25 sub-policies, each of "
                        "two ops applied with its probability at its level",
    "data.random_erasing": "the probability that a random box (2-33%% of the image, aspect 0.3-3.3) of each "
                           "training image is erased, after the ops and before mixing; 0 = off",
    "data.erasing_fill": "what an erased box holds: random (a standard normal per pixel once normalised, as "
                         "timm's 'pixel' mode) or mean (the dataset's mean: 0 once normalised)",
    "data.repeat_augment": "repeated augmentation: each training batch holds batch/k distinct images, each k "
                           "times with different draws; an epoch is one pass over the distinct images (k times "
                           "the steps); 1 = off",
    "model.kind": "model: vit (Vision Transformer), lm (decoder-only Transformer language model) or mlp (deep "
                  "ReLU MLP)",
    "model.vocab_size": "lm: vocabulary size (256 for text:PATH, which is byte-level)",
    "model.seq_len": "lm: tokens the model reads per sequence",
    "model.input_dim": "mlp: input features",
    "model.factory": "a model of your own: FILE.py:FUNCTION or package.module:FUNCTION, FUNCTION(cfg, rngs) "
                     "returning an nnx module (see docs/own-model.md)",
    "model.task": "with --model: classify, next-token or regress",
    "parallel.rules": "NAME=AXIS: map your model's axis NAME onto one of shardbench's logical axes (embed, mlp, "
                      "heads, kv, vocab, classes, layers, ...) or none; repeatable",
    "parallel.spmd": "SPMD style: jit (automatic partitioning), shard_map (explicit per-device program with "
                     "written-out collectives) or pmap (replicated parameters, data parallelism only)",
    "model.patch_size": "patch side in pixels", "model.embed_dim": "model width",
    "model.num_layers": "Transformer blocks, or the MLP's ReLU layers", "model.num_heads": "attention heads",
    "model.mlp_dim": "hidden width of each MLP block (the MLP model's width)",
    "model.num_classes": "output classes (the MLP's outputs)",
    "model.dropout": "dropout rate after the MLP's activation and output",
    "model.drop_path": "stochastic depth: the probability that the last block's residual branches are dropped "
                       "for an example (linear from 0 at the first block); 0 = off",
    "model.unroll": "layers per scan iteration: 1 = rolled loop (compile time flat in depth), N = N layers "
                    "per iteration, 0 = auto (all layers up to 8, else 1)",
    "model.attention": "attention kernel: einsum (two einsums, float32 scores), fused (jax.nn.dot_product_attention "
                       "with no implementation: XLA's composition), cudnn (cuDNN's fused kernel on a sequence padded "
                       "to --model.attention-pad-multiple; NVIDIA GPUs, bfloat16 or float16) or auto (fused on GPUs, "
                       "einsum elsewhere, and einsum with --model.lsa)",
    "model.attention_pad_multiple": "--model.attention cudnn: pad the sequence to a multiple of this (65 tokens: 72 "
                                    "for 8, 128 for 64); the padding is masked and sliced off",
    "model.qkv_layout": "q/k/v projection, from the same parameter: fused (one einsum to [3, batch, seq, heads, "
                        "dim]), split (three einsums) or seq-major (one einsum to [batch, seq, 3, heads, dim]); the "
                        "last two avoid the backward's [3, heads, dim, batch, seq] transpose",
    "model.pool": "vit: what the head sees: cls (the class token), mean (the mean of the patch tokens after the "
                  "final LayerNorm) or sequence (CCT's sequence pooling: a linear layer scores each token after the "
                  "final LayerNorm, the head sees their softmax-weighted sum); mean and sequence have no class token",
    "model.stem": "vit: how an image becomes tokens: patch (a linear projection of each --model.patch-size patch), "
                  "conv (Compact Convolutional Transformer's tokenizer: per layer a 3x3 convolution without bias, "
                  "ReLU and a 3x3 max-pool of stride 2; (image/2)^2 tokens for one layer) or shifted-patch (Shifted "
                  "Patch Tokenization: the image and its four diagonal shifts by half a patch, split into patches, "
                  "each LayerNormed and projected)",
    "model.stem_layers": "vit, --model.stem conv: convolution layers (1 for CCT-x/3x1, 2 for CCT-x/3x2); each "
                         "halves the image side, the ones before the last have 64 channels",
    "model.lsa": "vit: Locality Self-Attention (SPT/LSA): each head's softmax scale a learned parameter (from "
                 "1/sqrt(head dim)) and no token attending to itself; einsum attention only",
    "model.remat": "activation checkpointing per block: none, block (keep matmul outputs, recompute the "
                   "element-wise ops) or full (keep only each block's input)",
    "parallel.strategy": "how parameters and batches are split: auto (from the mesh), single, dp, fsdp, tp, "
                         "dp+tp, fsdp+tp",
    "parallel.mesh": "device mesh: N (all on the strategy's axis), AxB (data x model), data=A,model=B, "
                     "or none (one device, no mesh); '' = every device on the strategy's axis",
    "parallel.devices": "devices to use (0 = all); without accelerators, simulates N CPU devices",
    "precision.param_dtype": "parameter (and optimizer state) dtype: float32, bfloat16, float16",
    "precision.dtype": "compute dtype of activations and matmuls: float32, bfloat16, float16",
    "precision.matmul_precision": "matmul precision: default, high, highest",
    "optim.optimizer": "adamw, adam or sgd (with momentum)", "optim.lr": "peak learning rate",
    "optim.weight_decay": "decoupled weight decay on kernels (adamw)", "optim.b1": "Adam beta1",
    "optim.b2": "Adam beta2", "optim.momentum": "SGD momentum",
    "optim.warmup_steps": "linear warm-up steps (-1 = 5%% of training)",
    "optim.schedule": "cosine (decay after warm-up) or constant",
    "optim.end_lr_fraction": "final learning rate as a fraction of the peak (cosine)",
    "optim.grad_clip": "clip gradients to this global norm (0 = off)",
    "optim.mu_dtype": "adam/adamw first moment dtype: '' (the parameters' dtype), float32 or bfloat16",
    "optim.ema": "decay of an exponential moving average of the weights, which evaluation then uses (e.g. "
                 "0.999); 0 = off",
    "train.epochs": "epochs to train", "train.steps": "train exactly this many steps (overrides --epochs)",
    "train.batch_size": "global batch size (split over the data axis)",
    "train.eval_batch_size": "evaluation batch size (0 = --batch-size)",
    "train.label_smoothing": "classification: spread this fraction of each training target evenly over the "
                             "classes", "train.seed": "random seed",
    "train.out": "run directory ('' = runs/<preset>-<strategy>-<time>)",
    "train.resume": "continue the run in --out from its last checkpoint",
    "train.checkpoint_every": "save a checkpoint every N steps (and at the end; 0 = only at the end)",
    "train.keep_checkpoints": "checkpoints to keep", "train.log_every": "steps between scalar logs",
    "train.eval": "validate each epoch and test at the end", "train.progress": "show a progress bar",
    "train.run_name": "name of the run in reports and profiles ('' = from the configuration, e.g. "
                      "mesh_4_2_batch_1024)",
    "train.compile_cache": "persistent compilation cache: '' = <data cache dir>/xla (~/.cache/shardbench/xla), "
                           "'off', or a directory",
    "train.timing_warmup": "first step intervals left out of the step-time statistics (lowered, with a line "
                           "saying so, when a run has too few steps)",
    "train.recalibrate_peak": "on a CPU, measure the host's matmul peak for MFU afresh (and cache it) instead of "
                              "using the cached figure",
    "train.profile": "record a jax.profiler trace of a window of steps",
    "train.profile_skip": "steps to run before the traced window",
    "train.profile_steps": "steps in the traced window",
    "train.xla_presets": "comma list of named XLA compiler option sets put into XLA_FLAGS before JAX starts "
                         "(command-buffers, no-command-buffers, cudnn-layernorm, cudnn-gemm-fusion, no-triton-gemm, "
                         "autotune-0 .. autotune-4, latency-hiding); the flags the run used are in its record",
    "train.profile_root": "TensorBoard log dir for traces ('' = <out>/tensorboard); a trace lands in "
                          "<root>/plugins/profile/<run-name>/",
}


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One argument per Config field; short flags are alternative spellings of the same argument."""
    parser.add_argument("--preset", default=argparse.SUPPRESS, choices=sorted(config_lib.PRESETS),
                        help="starting configuration (default: vit-seed); flags override its fields")
    base = config_lib.Config()
    for section in config_lib.SECTIONS:
        group = parser.add_argument_group(f"{section} options")
        section_value = getattr(base, section)
        for name, kind in config_lib.field_types(type(section_value)).items():
            key = f"{section}.{name}"
            flags = [_flag(key)] + ([f"--{key}"] if "_" in name else [])
            if key in SHORT_FLAGS:
                flags.insert(0, SHORT_FLAGS[key])
            default = getattr(section_value, name)
            allowed = config_lib.RANGES.get(key)
            bounds = f"; range {allowed.text()}".replace("%", "%%") if allowed else ""
            help_text = f"{HELP.get(key, key)} (vit-seed: {default!r}{bounds})"
            if kind is bool:
                group.add_argument(*flags, dest=key, action=argparse.BooleanOptionalAction,
                                   default=argparse.SUPPRESS, help=help_text)
            else:
                metavar = "A,B" if typing.get_origin(kind) is tuple else getattr(kind, "__name__", "X").upper()
                group.add_argument(*flags, dest=key, default=argparse.SUPPRESS, metavar=metavar, help=help_text,
                                   action="append" if key in REPEATABLE else "store")


def config_from_args(args: argparse.Namespace) -> config_lib.Config:
    values: dict[str, Any] = {k: ",".join(v) if isinstance(v, list) else v for k, v in vars(args).items() if "." in k}
    cfg = config_lib.get_preset(getattr(args, "preset", "vit-seed"))
    return config_lib.override(cfg, values)


def setup_devices(cfg: config_lib.Config) -> None:
    """Simulate the devices a run of its own asks for (`--devices N` on a CPU)."""
    # Must run before anything asks JAX for devices.
    if cfg.parallel.devices > 0:
        from shardbench.devices import simulate_devices

        simulate_devices(cfg.parallel.devices)
