"""Models: flax nnx modules that name their axes logically and know nothing of meshes.

`MODELS` maps `model.kind` to a builder; a new model is its own module plus one entry here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from shardbench.config import Config, ModelConfig, check_choice
from shardbench.errors import ConfigError
from shardbench.models import custom, lm, mlp, transformer, vit
from shardbench.models.transformer import CUDNN, CUDNN_MAX_HEAD_DIM, EINSUM, FUSED, count_params

PRECISIONS = {
    "default": jax.lax.Precision.DEFAULT,
    "high": jax.lax.Precision.HIGH,
    "highest": jax.lax.Precision.HIGHEST,
}


# The models `--model.attention auto` runs cuDNN's fused attention for on an NVIDIA GPU, where cuDNN takes the
# configuration: those the GPU suite measured it faster on, on one H100. The vit: vit-seed, bfloat16, batch 1024
# (2026-11-26, benchmarks/data/h100-2026-11-26/): 31.41, 32.17 and 32.04 ms a step against XLA's composition's
# 34.61, 34.94 and 34.99 in three pairs of processes (0.91x), the same first losses, 10% less memory; on 2026-11-27
# (benchmarks/data/h100-2026-11-27/) 27.96 against 30.63. The lm: lm-seed, bfloat16, batch 32, sequence 1024
# (2026-11-27): 7.23 ms a step with cuDNN's causal attention against 24.27 (0.30x), the same first losses, peak
# memory 1,467 against 8,282 MiB. lm-seed's own 64 tokens were not measured under cuDNN.
AUTO_CUDNN_MODELS = ("vit", "lm")

# The models whose `--model.qkv-layout auto` is seq-major where their attention runs cuDNN's, else fused. vit-seed,
# bfloat16, batch 1024, cuDNN's attention, one H100 (2026-11-27, benchmarks/data/h100-2026-11-27/qkv/ and repeat/):
# seq-major 25.29 and 25.25 ms a step against fused's 28.00 and 28.00 (0.90x; split 26.03), the same first losses,
# 400 MiB more peak memory; on one H200 (2026-11-27, benchmarks/data/h200-2026-11-27/) 21.82 against 24.41 (0.89x).
# Under XLA's composition (2026-11-26) seq-major ran 34.66 against 34.61: no gain, so auto keeps fused there. The lm:
# lm-seed, bfloat16, batch 32, sequence 1024, cuDNN's attention, one H200 (2026-11-27, the same folder): seq-major
# 5.73 ms a step (p90 5.85) against fused's 6.10 (p90 6.51), one process each, first losses within 1.1e-6 of each
# other, the same peak memory.
AUTO_SEQ_MAJOR_MODELS = ("vit", "lm")


def attention_kind(setting: str, platform: str, cudnn_fits: bool = False) -> str:
    """The attention kind a block runs for `model.attention` on `platform` (jax.default_backend()): cudnn, fused
    or einsum. auto = cudnn on a GPU where `cudnn_fits` (see `auto_cudnn_problem`), else fused on GPUs, einsum
    elsewhere. fused is jax.nn.dot_product_attention with no implementation, which is XLA's composition: it never
    calls cuDNN."""
    if setting == CUDNN:
        return CUDNN
    if setting == "auto" and platform == "gpu":
        return CUDNN if cudnn_fits else FUSED
    return FUSED if setting == FUSED else EINSUM


def cudnn_device_problem(cfg: Config, devices: list[jax.Device]) -> str | None:
    """Why cuDNN's fused attention cannot run on these devices, or None: off NVIDIA GPUs (it needs compute
    capability 8.0 or later) or, before Hopper (9.0), with a head dim over 128. The dtype and the head dim's other
    limits need no devices: `transformer.cudnn_config_problem`."""
    device = devices[0] if devices else None
    platform = "none" if device is None else device.platform
    version = "" if device is None else str(getattr(device.client, "platform_version", "")).lower()
    kind = "" if device is None else str(getattr(device, "device_kind", "")).lower()
    # An NVIDIA GPU says so in its runtime's version ("cuda 12080") or its kind ("NVIDIA H100 80GB HBM3").
    if platform != "gpu" or not ("cuda" in version or "nvidia" in kind):
        where = platform if platform != "gpu" else f"gpu ({version or 'not CUDA'})"
        return (f"--model.attention cudnn needs an NVIDIA GPU (cuDNN), and this platform is {where}: use "
                f"--model.attention fused or einsum here")
    capability = str(getattr(device, "compute_capability", "0.0"))
    major_minor = tuple(int(part) for part in capability.split(".")[:2] if part.isdigit())
    head_dim = cfg.model.embed_dim // max(cfg.model.num_heads, 1)
    if major_minor < (8, 0):
        return (f"--model.attention cudnn needs compute capability 8.0 (Ampere) or later; this GPU "
                f"({device.device_kind}) has {capability}: use --model.attention fused")
    if major_minor < (9, 0) and head_dim > 128:
        return (f"--model.attention cudnn takes a head dim of at most 128 before Hopper (at most "
                f"{CUDNN_MAX_HEAD_DIM} from 9.0); this GPU ({device.device_kind}, {capability}) has "
                f"{head_dim}: change --model.num-heads, or use --model.attention fused")
    return None


def check_cudnn_devices(cfg: Config, devices: list[jax.Device]) -> None:
    """Refuse --model.attention cudnn in one line where these devices cannot run it (`cudnn_device_problem`)."""
    problem = cudnn_device_problem(cfg, devices)
    if problem:
        raise ConfigError(problem)


def auto_cudnn_config_problem(cfg: Config) -> str | None:
    """Why --model.attention auto never runs cuDNN's attention for `cfg`, on any device, or None where it may (on
    an NVIDIA GPU that takes it): a model the GPU suite has not measured it on (`AUTO_CUDNN_MODELS`), Locality
    Self-Attention (einsum only), or a dtype or head dim cuDNN does not take."""
    if cfg.model.kind not in AUTO_CUDNN_MODELS or cfg.model.factory:
        return f"not measured faster for the {cfg.model.kind}"
    if cfg.model.lsa:
        return "--model.lsa runs the einsum attention"
    return transformer.cudnn_config_problem(cfg.model, cfg.precision.dtype)


def auto_cudnn_problem(cfg: Config, devices: list[jax.Device]) -> str | None:
    """Why --model.attention auto does not run cuDNN's attention for `cfg` on these devices, or None where it
    does (`auto_cudnn_config_problem`, then the devices: `cudnn_device_problem`)."""
    return auto_cudnn_config_problem(cfg) or cudnn_device_problem(cfg, devices)


def resolve_attention(cfg: Config) -> str:
    """The attention kind this process's devices run for `cfg`; an explicit cudnn is checked against them first
    (one line), and auto runs cudnn only where `auto_cudnn_problem` finds nothing against it."""
    platform = jax.default_backend()
    if cfg.model.attention == CUDNN:
        check_cudnn_devices(cfg, jax.devices())
    fits = cfg.model.attention == "auto" and platform == "gpu" and auto_cudnn_problem(cfg, jax.devices()) is None
    return attention_kind(cfg.model.attention, platform, fits)


def attention_ran(cfg: Config) -> str | None:
    """The attention the model's blocks run, for the run record: cudnn, fused or einsum (einsum with
    Locality Self-Attention); None for a model without shardbench's attention (the mlp, a model of your own)."""
    if cfg.model.kind not in ("vit", "lm") or cfg.model.factory:
        return None
    return EINSUM if cfg.model.lsa else resolve_attention(cfg)


def qkv_layout_kind(cfg: Config, attention: str) -> str:
    """The q/k/v projection's layout for `cfg` when its blocks run `attention`: --model.qkv-layout, with auto =
    seq-major for the models of `AUTO_SEQ_MAJOR_MODELS` when the attention is cuDNN's, else fused. A strategy that
    splits the sequence (cp) runs the ring's attention instead of cuDNN's: fused there, as nothing measured it."""
    if cfg.model.qkv_layout != "auto":
        return cfg.model.qkv_layout
    splits_sequence = "cp" in cfg.parallel.strategy.split("+")
    seq_major = attention == CUDNN and cfg.model.kind in AUTO_SEQ_MAJOR_MODELS and not splits_sequence
    return "seq-major" if seq_major else "fused"


def qkv_layout_ran(cfg: Config) -> str | None:
    """The q/k/v layout the model's blocks run, for the run record (`qkv_layout_kind`); None for a model without
    shardbench's attention (the mlp, a model of your own)."""
    attention = attention_ran(cfg)
    return None if attention is None else qkv_layout_kind(cfg, attention)


def _blocks_config(cfg: Config, attention: str) -> ModelConfig:
    """`cfg.model` with its q/k/v layout resolved for `attention` (`qkv_layout_kind`): what the blocks build."""
    return dataclasses.replace(cfg.model, qkv_layout=qkv_layout_kind(cfg, attention))


def _vit(cfg: Config, **common: Any) -> nnx.Module:
    attention = resolve_attention(cfg)
    return vit.VisionTransformer(_blocks_config(cfg, EINSUM if cfg.model.lsa else attention),
                                 image_size=cfg.data.image_size, attention=attention, **common)


def _lm(cfg: Config, **common: Any) -> nnx.Module:
    attention = resolve_attention(cfg)
    return lm.TransformerLM(_blocks_config(cfg, attention), attention=attention, **common)


def _mlp(cfg: Config, **common: Any) -> nnx.Module:
    return mlp.DeepMLP(cfg.model, **common)


# kind -> (builder, which configuration field each logical axis comes from, for divisibility errors)
MODELS: dict[str, tuple[Callable[..., nnx.Module], dict[str, str]]] = {
    "vit": (_vit, vit.AXIS_FIELDS),
    "lm": (_lm, lm.AXIS_FIELDS),
    "mlp": (_mlp, mlp.AXIS_FIELDS),
}


def check_kind(kind: str) -> None:
    """One line for a model kind shardbench has no builder for (the kinds are --model.kind's declared choices)."""
    check_choice("model.kind", kind)


def axis_fields(cfg: Config) -> dict[str, str]:
    """Which configuration field each logical axis comes from (none for a model of your own)."""
    if cfg.model.factory:
        return {}
    check_kind(cfg.model.kind)
    return MODELS[cfg.model.kind][1]


def build_model(cfg: Config, rngs: nnx.Rngs) -> nnx.Module:
    """The model a configuration describes, with its dtypes and matmul precision; `--model FILE:FUNCTION`
    builds a model of your own (`shardbench.models.custom`), which takes its dtypes from `cfg` itself."""
    if cfg.model.factory:
        return custom.build(cfg, rngs)
    check_kind(cfg.model.kind)
    return MODELS[cfg.model.kind][0](
        cfg, dtype=jnp.dtype(cfg.precision.dtype), param_dtype=jnp.dtype(cfg.precision.param_dtype),
        precision=PRECISIONS[cfg.precision.matmul_precision], rngs=rngs,
    )


__all__ = ["AUTO_CUDNN_MODELS", "AUTO_SEQ_MAJOR_MODELS", "MODELS", "PRECISIONS", "attention_kind", "attention_ran",
           "auto_cudnn_config_problem", "auto_cudnn_problem", "axis_fields", "build_model", "check_cudnn_devices",
           "count_params", "cudnn_device_problem", "qkv_layout_kind", "qkv_layout_ran", "resolve_attention"]
