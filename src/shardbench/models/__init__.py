"""Models: flax nnx modules that name their axes logically and know nothing of meshes.

`MODELS` maps `model.kind` to a builder; a new model is its own module plus one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from shardbench.config import Config, check_choice
from shardbench.errors import ConfigError
from shardbench.models import custom, lm, mlp, vit
from shardbench.models.transformer import CUDNN, CUDNN_MAX_HEAD_DIM, EINSUM, FUSED, count_params

PRECISIONS = {
    "default": jax.lax.Precision.DEFAULT,
    "high": jax.lax.Precision.HIGH,
    "highest": jax.lax.Precision.HIGHEST,
}


def fused_attention(setting: str, platform: str) -> bool:
    """`model.attention`: 'fused' or 'einsum', or 'auto' = fused on GPUs, einsum elsewhere. 'fused' is
    jax.nn.dot_product_attention with no implementation, which is XLA's composition: it never calls cuDNN."""
    # auto is unchanged (it never picks cudnn) until the GPU suite measures cudnn: what it has measured is auto
    # (fused) 30.6 ms against einsum 31.27 ms per step, vit-seed bfloat16 batch 1024 on an H100, 2026-11-24.
    return setting == "fused" or (setting == "auto" and platform == "gpu")


def attention_kind(setting: str, platform: str) -> str:
    """The attention kind a block runs for `model.attention` on `platform` (jax.default_backend()): cudnn,
    fused or einsum (see `fused_attention` for auto)."""
    if setting == CUDNN:
        return CUDNN
    return FUSED if fused_attention(setting, platform) else EINSUM


def check_cudnn_devices(cfg: Config, devices: list[jax.Device]) -> None:
    """Refuse --model.attention cudnn in one line where cuDNN cannot run it: off NVIDIA GPUs (cuDNN's fused
    attention needs compute capability 8.0 or later) or, before Hopper (9.0), with a head dim over 128. The
    dtype and the head dim's other limits need no devices: `transformer.check_cudnn_config`."""
    device = devices[0] if devices else None
    platform = "none" if device is None else device.platform
    version = "" if device is None else str(getattr(device.client, "platform_version", "")).lower()
    kind = "" if device is None else str(getattr(device, "device_kind", "")).lower()
    # An NVIDIA GPU says so in its runtime's version ("cuda 12080") or its kind ("NVIDIA H100 80GB HBM3").
    if platform != "gpu" or not ("cuda" in version or "nvidia" in kind):
        where = platform if platform != "gpu" else f"gpu ({version or 'not CUDA'})"
        raise ConfigError(f"--model.attention cudnn needs an NVIDIA GPU (cuDNN), and this platform is {where}: use "
                          f"--model.attention fused or einsum here")
    capability = str(getattr(device, "compute_capability", "0.0"))
    major_minor = tuple(int(part) for part in capability.split(".")[:2] if part.isdigit())
    head_dim = cfg.model.embed_dim // max(cfg.model.num_heads, 1)
    if major_minor < (8, 0):
        raise ConfigError(f"--model.attention cudnn needs compute capability 8.0 (Ampere) or later; this GPU "
                          f"({device.device_kind}) has {capability}: use --model.attention fused")
    if major_minor < (9, 0) and head_dim > 128:
        raise ConfigError(f"--model.attention cudnn takes a head dim of at most 128 before Hopper (at most "
                          f"{CUDNN_MAX_HEAD_DIM} from 9.0); this GPU ({device.device_kind}, {capability}) has "
                          f"{head_dim}: change --model.num-heads, or use --model.attention fused")


def resolve_attention(cfg: Config) -> str:
    """The attention kind this process's devices run for `cfg`; cudnn is checked against them first (one line)."""
    kind = attention_kind(cfg.model.attention, jax.default_backend())
    if kind == CUDNN:
        check_cudnn_devices(cfg, jax.devices())
    return kind


def _vit(cfg: Config, **common: Any) -> nnx.Module:
    return vit.VisionTransformer(cfg.model, image_size=cfg.data.image_size, attention=resolve_attention(cfg),
                                 **common)


def _lm(cfg: Config, **common: Any) -> nnx.Module:
    return lm.TransformerLM(cfg.model, attention=resolve_attention(cfg), **common)


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


__all__ = ["MODELS", "PRECISIONS", "attention_kind", "axis_fields", "build_model", "check_cudnn_devices",
           "count_params", "fused_attention", "resolve_attention"]
