"""Models: flax nnx modules that name their axes logically and know nothing of meshes.

`MODELS` maps `model.kind` to a builder; a new model is its own module plus one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from shardbench.config import Config
from shardbench.errors import ConfigError
from shardbench.models import custom, lm, mlp, vit
from shardbench.models.transformer import count_params

PRECISIONS = {
    "default": jax.lax.Precision.DEFAULT,
    "high": jax.lax.Precision.HIGH,
    "highest": jax.lax.Precision.HIGHEST,
}


def fused_attention(setting: str, platform: str) -> bool:
    """`model.attention`: 'fused' or 'einsum', or 'auto' = fused on GPUs (cuDNN's kernel), einsum elsewhere."""
    return setting == "fused" or (setting == "auto" and platform == "gpu")


def _vit(cfg: Config, **common: Any) -> nnx.Module:
    return vit.VisionTransformer(cfg.model, image_size=cfg.data.image_size,
                                 fused_attention=fused_attention(cfg.model.attention, jax.default_backend()),
                                 **common)


def _lm(cfg: Config, **common: Any) -> nnx.Module:
    return lm.TransformerLM(cfg.model, fused_attention=fused_attention(cfg.model.attention, jax.default_backend()),
                            **common)


def _mlp(cfg: Config, **common: Any) -> nnx.Module:
    return mlp.DeepMLP(cfg.model, **common)


# kind -> (builder, which configuration field each logical axis comes from, for divisibility errors)
MODELS: dict[str, tuple[Callable[..., nnx.Module], dict[str, str]]] = {
    "vit": (_vit, vit.AXIS_FIELDS),
    "lm": (_lm, lm.AXIS_FIELDS),
    "mlp": (_mlp, mlp.AXIS_FIELDS),
}


def check_kind(kind: str) -> None:
    if kind not in MODELS:
        raise ConfigError(f"unknown --model.kind '{kind}': choose one of {', '.join(MODELS)}")


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


__all__ = ["MODELS", "PRECISIONS", "axis_fields", "build_model", "count_params", "fused_attention"]
