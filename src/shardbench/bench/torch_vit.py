"""A PyTorch baseline of shardbench's Vision Transformer train step, for throughput comparisons.

The model has the same shapes, parameter count (10,695,562 for the default `ModelConfig`) and
initialisation as `shardbench.models.vit`: a stride-`patch` Conv2d patch embedding, a class token
(zeros) in front, a learned position embedding, pre-LayerNorm encoder blocks (fused q/k/v projection,
`F.scaled_dot_product_attention`, tanh-GELU MLP with dropout), a final LayerNorm on the class token and
a linear head. The train step keeps float32 parameters (compute in bfloat16/float16 under
`torch.autocast` when asked, as people run it): mean cross-entropy, backward, global-norm clipping to 1.0,
AdamW (lr 1e-3, betas (0.9, 0.999), weight decay 0.05 on weight matrices and the patch kernel only),
`zero_grad(set_to_none=True)`. AdamW uses the fused implementation when this torch build has it for
the device, else the foreach one. The step runs on the first CUDA GPU when torch sees one, else on the CPU.
Float32 matmuls get the arithmetic JAX's run uses (TF32 on a GPU for JAX's "default" and "high", full
float32 for "highest" and on the CPU; see `shardbench.bench.matmul`).

Batches are random normalised float32 images (N, 3, 32, 32) and int64 labels made once up front, so
only the train step is timed (by `shardbench.bench`, through `prepare`). torch is optional: it is imported inside functions, and `available()`
says in one line why it cannot be used.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

    from shardbench.config import ModelConfig

TORCH_PIN = "2.13.0"
LN_EPSILON = 1e-6
LR = 1e-3
BETAS = (0.9, 0.999)
WEIGHT_DECAY = 0.05
GRAD_CLIP = 1.0
POS_EMBED_STD = 0.02

Step = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]


def available() -> str | None:
    """None when torch imports; otherwise a one-line reason."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return f"torch is not installed: pip install torch=={TORCH_PIN}"
    except Exception as err:  # noqa: BLE001 - a broken install (missing library, ABI mismatch)
        first_line = (str(err).splitlines() or [type(err).__name__])[0]
        return f"torch failed to import: {first_line}"
    return None


# ------------------------------------------------------------------------------------------------- model
@functools.cache
def _vit_class() -> type[nn.Module]:
    """The ViT module class, defined on first use so that this module imports without torch."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, embed_dim: int, num_heads: int) -> None:
            super().__init__()
            self.num_heads = num_heads
            self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
            self.qkv.fused_qkv = True  # q, k and v are initialised as three (E, E) matrices
            self.out = nn.Linear(embed_dim, embed_dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, e = x.shape
            qkv = self.qkv(x).view(b, t, 3, self.num_heads, e // self.num_heads).permute(2, 0, 3, 1, 4)
            attn = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])  # (b, heads, t, head_dim)
            return self.out(attn.transpose(1, 2).reshape(b, t, e))

    class Block(nn.Module):
        def __init__(self, cfg: ModelConfig) -> None:
            super().__init__()
            e = cfg.embed_dim
            self.ln1 = nn.LayerNorm(e, eps=LN_EPSILON)
            self.attn = Attention(e, cfg.num_heads)
            self.ln2 = nn.LayerNorm(e, eps=LN_EPSILON)
            self.mlp = nn.Sequential(
                nn.Linear(e, cfg.mlp_dim), nn.GELU(approximate="tanh"), nn.Dropout(cfg.dropout),
                nn.Linear(cfg.mlp_dim, e), nn.Dropout(cfg.dropout),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class TorchVisionTransformer(nn.Module):
        def __init__(self, cfg: ModelConfig, image_size: int) -> None:
            super().__init__()
            e, p = cfg.embed_dim, cfg.patch_size
            self.patch_embed = nn.Conv2d(3, e, kernel_size=p, stride=p)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, e))
            self.pos_embed = nn.Parameter(torch.zeros(1, (image_size // p) ** 2 + 1, e))
            self.blocks = nn.Sequential(*(Block(cfg) for _ in range(cfg.num_layers)))
            self.norm = nn.LayerNorm(e, eps=LN_EPSILON)
            self.head = nn.Linear(e, cfg.num_classes)

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (b, patches, e)
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
            x = self.blocks(x)
            return self.head(self.norm(x[:, 0]))

    return TorchVisionTransformer


def _xavier_uniform_(weight: torch.Tensor, fan_in: int, fan_out: int) -> None:
    import torch

    bound = math.sqrt(6.0 / (fan_in + fan_out))
    with torch.no_grad():
        weight.uniform_(-bound, bound)


def _init_weights(model: nn.Module) -> None:
    """The JAX model's initialisation: Xavier-uniform kernels (fans as in JAX: the patch kernel's fan-in
    is patch*patch*3, and q, k and v are three separate (E, E) matrices), zero biases, zero class token,
    position embedding from a normal with std 0.02 truncated at two deviations."""
    import torch
    from torch import nn

    for module in model.modules():
        if isinstance(module, nn.Linear):
            out_features, in_features = module.weight.shape
            chunks = 3 if getattr(module, "fused_qkv", False) else 1
            for chunk in module.weight.chunk(chunks, dim=0):
                _xavier_uniform_(chunk, in_features, out_features // chunks)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Conv2d):
            e, c, kh, kw = module.weight.shape
            _xavier_uniform_(module.weight, c * kh * kw, e)
            nn.init.zeros_(module.bias)
    nn.init.trunc_normal_(model.pos_embed, std=POS_EMBED_STD, a=-2 * POS_EMBED_STD, b=2 * POS_EMBED_STD)
    with torch.no_grad():
        model.cls_token.zero_()


def build_model(model: ModelConfig, *, image_size: int = 32, seed: int = 0) -> nn.Module:
    """The ViT for `model`, initialised from `seed`, in train mode."""
    import torch

    torch.manual_seed(seed)
    vit = _vit_class()(model, image_size)
    _init_weights(vit)
    return vit.train()


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# --------------------------------------------------------------------------------------------- optimizer
def _param_groups(module: nn.Module) -> list[dict[str, Any]]:
    """Weight decay on weight matrices and the patch kernel only: not on biases, LayerNorms, the class
    token or the position embedding (the same mask as shardbench's `*kernel` rule)."""
    no_decay_names = {"cls_token", "pos_embed"}
    decay, no_decay = [], []
    for name, param in module.named_parameters():
        is_kernel = param.ndim >= 2 and name not in no_decay_names
        (decay if is_kernel else no_decay).append(param)
    return [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]


def _make_optimizer(module: nn.Module) -> tuple[torch.optim.Optimizer, str]:
    """AdamW, fused when this build supports it on CPU, else foreach; returns (optimizer, which)."""
    import torch

    groups = _param_groups(module)
    try:
        return torch.optim.AdamW(groups, lr=LR, betas=BETAS, fused=True), "fused"
    except (RuntimeError, ValueError, TypeError):
        return torch.optim.AdamW(groups, lr=LR, betas=BETAS, foreach=True), "foreach"


# -------------------------------------------------------------------------------------------- train step
def _make_step(model: Callable[[torch.Tensor], torch.Tensor], optimizer: torch.optim.Optimizer,
               params: list[torch.Tensor], autocast: torch.dtype | None = None) -> Step:
    """One train step on (images, labels); returns the (detached) loss. With `autocast` (a 16-bit dtype)
    the forward runs under `torch.autocast`, the loss in float32."""
    import contextlib

    import torch
    import torch.nn.functional as F

    def step(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        context = (torch.autocast(images.device.type, dtype=autocast) if autocast is not None
                   else contextlib.nullcontext())
        with context:
            logits = model(images)
        loss = F.cross_entropy(logits.float(), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously; the CPU is already done)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(step: Step, images: torch.Tensor, labels: torch.Tensor) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    loss = step(images, labels)
    synchronize(images.device)
    return time.perf_counter() - start, loss


def _first_step(vit: nn.Module, optimizer: torch.optim.Optimizer, compile: bool, images: torch.Tensor,
                labels: torch.Tensor, autocast: torch.dtype | None = None, mode: str = "default"
                ) -> tuple[Step, str, float, torch.Tensor]:
    """Build the step (compiled whole when that works, else with only the model compiled), run it once.

    `mode` is torch.compile's mode ("default", "reduce-overhead": CUDA graphs on a GPU, "max-autotune").
    Returns (step, "step" | "model" | "none", seconds of the first step including any compilation, loss).
    """
    import torch

    params = list(vit.parameters())
    if not compile:
        step = _make_step(vit, optimizer, params, autocast)
        return step, "none", *_timed(step, images, labels)
    torch._dynamo.reset()  # fresh guards and recompile budget for each measurement in one process
    try:
        step = torch.compile(_make_step(vit, optimizer, params, autocast), mode=mode)
        return step, "step", *_timed(step, images, labels)
    except Exception:  # noqa: BLE001 - any compile failure falls back to compiling the model only
        optimizer.zero_grad(set_to_none=True)
        torch._dynamo.reset()
        step = _make_step(torch.compile(vit, mode=mode), optimizer, params, autocast)
        return step, "model", *_timed(step, images, labels)


def _batch(model: ModelConfig, batch_size: int, image_size: int,
           seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random normalised float32 images (N, 3, H, W) and int64 labels, made once."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    images = torch.randn(batch_size, 3, image_size, image_size, generator=gen, dtype=torch.float32)
    labels = torch.randint(0, model.num_classes, (batch_size,), generator=gen, dtype=torch.int64)
    return images, labels


AUTOCAST = {"float32": None, "bfloat16": "bfloat16", "float16": "float16"}


def device() -> torch.device:
    """The first CUDA GPU torch sees, else the CPU."""
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def peak_memory_bytes(where: torch.device) -> int | None:
    """The CUDA caching allocator's peak since start (None on the CPU, where torch keeps no such count)."""
    import torch

    return int(torch.cuda.max_memory_allocated(where)) if where.type == "cuda" else None


def set_matmul_precision(matmul_precision: str, where: torch.device) -> dict[str, object]:
    """Give float32 matmuls and convolutions on `where` the arithmetic JAX's run uses for shardbench's
    `matmul_precision` (see `shardbench.bench.matmul`); returns what was set and what matmuls compute in."""
    import torch

    from shardbench.bench.matmul import torch_matmul

    capability = torch.cuda.get_device_capability(where) if where.type == "cuda" else None
    chosen = torch_matmul(matmul_precision, where.type, capability)
    torch.set_float32_matmul_precision(chosen.float32_matmul_precision)
    torch.backends.cuda.matmul.allow_tf32 = chosen.allow_tf32
    torch.backends.cudnn.allow_tf32 = chosen.allow_tf32
    return {"matmul": chosen.label, "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32)}


def prepare(model: ModelConfig, *, batch_size: int, compile: bool, dtype: str = "float32", seed: int = 0,
            threads: int | None = None, image_size: int = 32, matmul_precision: str = "default",
            compile_mode: str = "default") -> tuple[Callable[[], None], dict[str, object], torch.device]:
    """Build the model, optimizer and batch on `device()`, and run the first step (which includes
    torch.compile's compilation when `compile`). `dtype` other than float32 is the autocast dtype;
    `matmul_precision` is shardbench's name for the float32 matmul arithmetic (`set_matmul_precision`).
    Returns a function that runs one more step (queued on a GPU: `synchronize` waits for it), what to
    record ({"first_step_s", "params", "torch_version", "threads", "compiled": "step" | "model" | "none",
    "compile_mode": torch.compile's mode or "none",
    "adamw": "fused" | "foreach", "device", "autocast", "matmul" and the torch settings behind it}) and
    the device."""
    import torch

    if dtype not in AUTOCAST:
        raise ValueError(f"dtype {dtype!r}: the PyTorch baseline takes {', '.join(AUTOCAST)}")
    autocast = getattr(torch, AUTOCAST[dtype]) if AUTOCAST[dtype] else None
    used_threads = threads if threads is not None else (os.cpu_count() or 1)
    torch.set_num_threads(used_threads)
    where = device()
    matmul = set_matmul_precision(matmul_precision, where)  # before torch.compile, which reads it
    vit = build_model(model, image_size=image_size, seed=seed).to(where)
    optimizer, adamw = _make_optimizer(vit)
    images, labels = (t.to(where) for t in _batch(model, batch_size, image_size, seed))
    step, compiled, first_step_s, _ = _first_step(vit, optimizer, compile, images, labels, autocast, compile_mode)

    def one_step() -> None:
        step(images, labels)

    return one_step, {
        "first_step_s": first_step_s,
        "params": count_params(vit),
        "torch_version": torch.__version__,
        "threads": used_threads,
        "compiled": compiled,
        "compile_mode": compile_mode if compile else "none",
        "adamw": adamw,
        "device": torch.cuda.get_device_name(where) if where.type == "cuda" else "cpu",
        "autocast": AUTOCAST[dtype],
        **matmul,
    }, where
