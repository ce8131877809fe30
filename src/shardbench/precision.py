"""Precision checks: can this backend run the requested parameter dtype, compute dtype and matmul precision?"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from shardbench.config import PrecisionConfig
from shardbench.errors import ConfigError
from shardbench.models import PRECISIONS


def check_supported(cfg: PrecisionConfig, device: jax.Device) -> None:
    """Run a tiny matmul, its gradient and a float32 softmax in exactly the requested precision on `device`.

    Some backends reject some combinations only when the big program runs (the seeds hit
    'Dot algorithm ALG_DOT_F16_F16_F32 is not supported'); this fails in a second, with the combination named.
    A combination that ran is not probed again in this process (a refused one is, each time it is asked for).
    """
    key = (cfg.param_dtype, cfg.dtype, cfg.matmul_precision, device.platform, getattr(device, "device_kind", ""))
    if key not in _RAN:
        _probe(cfg.param_dtype, cfg.dtype, cfg.matmul_precision, device)
        _RAN.add(key)


# The combinations the probe ran in this process, by device platform and kind.
_RAN: set[tuple[str, str, str, str, str]] = set()


def _probe(param_name: str, dtype_name: str, matmul_precision: str, device: jax.Device) -> None:
    param_dtype, dtype = jnp.dtype(param_name), jnp.dtype(dtype_name)
    precision = PRECISIONS[matmul_precision]

    def probe(w: jax.Array, x: jax.Array) -> jax.Array:
        def loss(w: jax.Array) -> jax.Array:
            y = jnp.einsum("bi,io->bo", x.astype(dtype), w.astype(dtype), precision=precision)
            s = jnp.einsum("bo,co->bc", y, y, precision=precision, preferred_element_type=jnp.float32)
            return jax.nn.log_softmax(s.astype(jnp.float32)).mean()

        return jax.grad(loss)(w)

    try:
        w = jax.device_put(jnp.ones((16, 16), param_dtype), device)
        x = jax.device_put(jnp.ones((8, 16), jnp.float32), device)
        jax.block_until_ready(jax.jit(probe)(w, x))
    except Exception as err:  # the backend's own words are the useful part
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            f"--param-dtype {param_name} --dtype {dtype_name} --matmul-precision {matmul_precision} "
            f"cannot run on {device.platform}: {first[:200]}; try --dtype float32 or --param-dtype float32"
        ) from None
