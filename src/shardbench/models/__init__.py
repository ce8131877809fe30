"""Models: flax nnx modules that name their axes logically and know nothing of meshes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from shardbench.config import Config
from shardbench.models.vit import AXIS_FIELDS, VisionTransformer, count_params

PRECISIONS = {
    "default": jax.lax.Precision.DEFAULT,
    "high": jax.lax.Precision.HIGH,
    "highest": jax.lax.Precision.HIGHEST,
}


def fused_attention(setting: str, platform: str) -> bool:
    """`model.attention`: 'fused' or 'einsum', or 'auto' = fused on GPUs (cuDNN's kernel), einsum elsewhere."""
    return setting == "fused" or (setting == "auto" and platform == "gpu")


def build_model(cfg: Config, rngs: nnx.Rngs) -> VisionTransformer:
    """The model a configuration describes, with its dtypes and matmul precision."""
    return VisionTransformer(
        cfg.model,
        image_size=cfg.data.image_size,
        dtype=jnp.dtype(cfg.precision.dtype),
        param_dtype=jnp.dtype(cfg.precision.param_dtype),
        precision=PRECISIONS[cfg.precision.matmul_precision],
        fused_attention=fused_attention(cfg.model.attention, jax.default_backend()),
        rngs=rngs,
    )


__all__ = ["AXIS_FIELDS", "PRECISIONS", "VisionTransformer", "build_model", "count_params"]
