"""Which arithmetic a float32 matmul gets on each side of the step comparison, so float32 rows compare like with like.

JAX (XLA) on an NVIDIA GPU with TF32 (compute capability 8.0 and up) runs float32 matmuls and convolutions
with precision "default" or "high" as TF32 (XLA allows TF32 for any precision below HIGHEST; "high" becomes a
3-pass bfloat16 algorithm only under XLA_FLAGS=--xla_gpu_enable_bf16_3way_gemm), and "highest" in full float32.
PyTorch on CUDA runs float32 matmuls in full float32 unless TF32 is allowed. So the bench gives PyTorch the
closest setting to JAX's:

  JAX "default" or "high"  ->  torch.set_float32_matmul_precision("high"), torch.backends.cuda.matmul.allow_tf32
                               and torch.backends.cudnn.allow_tf32 True: TF32 (torch's "high" is TF32 on CUDA;
                               its "medium", bfloat16, has no JAX counterpart on a GPU)
  JAX "highest"            ->  "highest", both allow_tf32 False: full float32

On the CPU neither side has a reduced-precision float32 matmul: both run full float32 whatever the setting
(torch's settings are still set to "highest", so the record says what was asked). On a TPU, JAX runs float32
matmuls as 1 ("default"), 3 ("high") or 6 ("highest") bfloat16 passes, and PyTorch runs on the host CPU.
Nothing here imports JAX or torch.
"""

from __future__ import annotations

from dataclasses import dataclass

TPU_PASSES = {"default": 1, "high": 3, "highest": 6}


@dataclass(frozen=True)
class TorchMatmul:
    """What the PyTorch worker sets before building its model, and what float32 matmuls then compute in."""

    float32_matmul_precision: str  # for torch.set_float32_matmul_precision
    allow_tf32: bool  # torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    label: str  # "TF32" or "float32"


def has_tf32(capability: tuple[int, int] | None) -> bool:
    """Whether an NVIDIA GPU of this compute capability has TF32 tensor cores (Ampere, 8.0, and later)."""
    return capability is not None and tuple(capability) >= (8, 0)


def torch_matmul(matmul_precision: str, device_type: str, capability: tuple[int, int] | None = None) -> TorchMatmul:
    """PyTorch's settings for shardbench's `precision.matmul_precision` on a torch device type ("cuda", "cpu")
    of compute `capability` (CUDA only): TF32 where JAX's run uses TF32, full float32 elsewhere."""
    if matmul_precision not in TPU_PASSES:
        raise ValueError(f"matmul precision {matmul_precision!r}: choose from {', '.join(TPU_PASSES)}")
    if device_type == "cuda" and matmul_precision != "highest":
        return TorchMatmul("high", True, "TF32" if has_tf32(capability) else "float32")
    return TorchMatmul("highest", False, "float32")


def jax_matmul(matmul_precision: str, platform: str, capability: tuple[int, int] | None = None) -> str:
    """What JAX's float32 matmuls compute in for `matmul_precision` on `platform` ("cpu", "gpu", "tpu")."""
    if matmul_precision not in TPU_PASSES:
        raise ValueError(f"matmul precision {matmul_precision!r}: choose from {', '.join(TPU_PASSES)}")
    if platform == "tpu":
        return f"bfloat16 x{TPU_PASSES[matmul_precision]}"
    if platform == "gpu" and matmul_precision != "highest":
        return "TF32" if capability is None or has_tf32(capability) else "float32"
    return "float32"


def label(dtype: str, sides: dict[str, str]) -> str:
    """One phrase for a setting: "TF32 both", or each side's ("JAX TF32, PyTorch float32"); for a 16-bit
    dtype, the dtype itself (its matmuls are 16-bit on both sides)."""
    if dtype != "float32":
        return f"{dtype} matmuls both"
    found = {k: v for k, v in sides.items() if v}
    if not found:
        return ""
    if len(set(found.values())) == 1:
        return f"{next(iter(found.values()))} both" if len(found) > 1 else f"{next(iter(found.values()))}"
    return ", ".join(f"{k} {v}" for k, v in found.items())
