"""The model and optimizer speed switches: cuDNN attention on a padded sequence, mean pooling, the q/k/v
projection layout and Adam's first moment in bfloat16. Those that compute the same model must give today's
numbers (and a q/k/v layout must be the one the model lowers, as the losses cannot tell); those that make another
model must be counted and trained right; where one cannot run, one line says so.

cuDNN itself needs an NVIDIA GPU, so on the CPU its padding and sequence lengths run through XLA's implementation
of the same call (the 'padded-xla' attention kind) and are compared with the unpadded einsum attention.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from shardbench import config as config_lib
from shardbench import models
from shardbench.errors import ConfigError
from shardbench.measure.memory import per_device_bytes
from shardbench.models import attention_kind, auto_cudnn_problem, build_model, count_params, qkv_layout_kind
from shardbench.models.lm import TransformerLM
from shardbench.models.transformer import attention, padded_attention, padded_length, project_qkv
from shardbench.models.vit import VisionTransformer, flops_per_example
from shardbench.parsing import override
from shardbench.presets import get_preset
from shardbench.tasks import validate
from shardbench.train.loop import run
from shardbench.optim import build_optimizer
from conftest import logged_losses as _losses



def close(got: Any, want: Any) -> None:
    """Equal up to float32 reordering: the padded path sums the same terms as the einsum's, in another order
    (relative 1e-5, or 2e-6 of the array's largest magnitude for entries near zero)."""
    want = np.asarray(want)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6 * max(1.0, float(np.abs(want).max())))


# The training runs: conftest's micro ViT with one block (compiling dominates a run on two cores), on one device.
ONE = {"model.num_layers": 1, "parallel.strategy": "single"}


def _train(cfg: config_lib.Config) -> list[float]:
    run(cfg)
    return _losses(Path(cfg.train.out))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """Today's model and optimizer (every switch at its default) on one device: four losses."""
    from conftest import micro_config

    return _train(micro_config(tmp_path_factory.mktemp("reference"), **ONE))


# ------------------------------------------------------------------------------------------- cuDNN attention
def test_padded_length() -> None:
    assert [padded_length(65, m) for m in (1, 2, 8, 64)] == [65, 66, 72, 128]
    assert padded_length(64, 8) == 64


@pytest.mark.parametrize("causal", [False, True], ids=["vit", "lm"])
def test_padded_attention_equals_einsum_attention(causal: bool) -> None:
    """The function alone, at vit-seed's 65 tokens: outputs and q/k/v gradients."""
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v = (jax.random.normal(key, (3, 65, 2, 8), jnp.float32) for key in keys[:3])
    cotangent = jax.random.normal(keys[3], (3, 65, 2, 8), jnp.float32)

    def loss(fn: Any) -> Any:
        return jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(fn(q, k, v) * cotangent), argnums=(0, 1, 2)))(
            q, k, v)

    want = loss(lambda q, k, v: attention(q, k, v, kind="einsum", precision=jax.lax.Precision.HIGHEST,
                                          causal=causal))
    for multiple, padded in ((2, 66), (64, 128)):  # 8 runs in the model test below
        fn = functools.partial(padded_attention, causal=causal, multiple=multiple, implementation="xla")
        got = loss(fn)
        jax.tree.map(close, got, want)
        # and it did pad: the attention runs on the padded sequence, which the result alone cannot show
        assert f"tensor<3x{padded}x2x8xf32>" in jax.jit(fn).lower(q, k, v).as_text(), (multiple, padded)


def _model_loss_and_grads(model: nnx.Module, inputs: jax.Array) -> tuple[jax.Array, Any]:
    graphdef, params = nnx.split(model)

    def loss(p: Any) -> jax.Array:
        out = nnx.merge(graphdef, p)(inputs)
        return jnp.sum(out * jnp.cos(jnp.arange(out.size).reshape(out.shape)))

    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["vit", "lm"])
def test_cudnn_path_gives_the_einsum_models_outputs_and_gradients(kind: str) -> None:
    """Whole models, float32: the ViT (17 tokens padded to 24, not causal) and the LM (13 tokens padded to 16,
    causal) with the cudnn kind's padding run by XLA, against the einsum attention; same parameters."""
    base = config_lib.ModelConfig(patch_size=8, embed_dim=32, num_layers=1, num_heads=4, mlp_dim=64, dropout=0.0,
                                  kind=kind, vocab_size=64, seq_len=13, attention_pad_multiple=8)
    if kind == "vit":
        inputs = jax.random.normal(jax.random.key(1), (2, 32, 32, 3), jnp.float32)
        make = lambda attn: VisionTransformer(base, image_size=32, attention=attn, rngs=nnx.Rngs(0))  # noqa: E731
    else:
        inputs = jax.random.randint(jax.random.key(1), (2, 13), 0, 64)
        make = lambda attn: TransformerLM(base, attention=attn, rngs=nnx.Rngs(0))  # noqa: E731
    want_loss, want_grads = _model_loss_and_grads(make("einsum"), inputs)
    got_loss, got_grads = _model_loss_and_grads(make("padded-xla"), inputs)
    close(got_loss, want_loss)
    jax.tree.map(close, got_grads, want_grads)


def test_cudnn_refusals_are_one_line() -> None:
    vit = get_preset("vit-seed")
    cases = {
        "float32": ({"model.attention": "cudnn"}, r"cudnn \(an NVIDIA GPU's fused attention\) needs a 16-bit compute "
                                                  r"dtype, not --dtype float32: on an NVIDIA GPU add --dtype bfloat16 "
                                                  r"\(or float16\); elsewhere use --model.attention fused"),
        "head dim 12": ({"model.attention": "cudnn", "precision.dtype": "bfloat16", "model.num_heads": 32},
                        r"multiple of 8 and at most 256, not 384/32 = 12"),
        "head dim 384": ({"model.attention": "cudnn", "precision.dtype": "float16", "model.num_heads": 1},
                         r"not 384/1 = 384"),
        "unknown": ({"model.attention": "flash"}, r"choose one of auto, einsum, fused, cudnn"),
    }
    for name, (overrides, message) in cases.items():
        with pytest.raises(ConfigError, match=message) as err:
            validate(override(vit, overrides))
        assert "\n" not in str(err.value), name
    # The configuration is fine; this CPU is not: refused where the model is built, before anything compiles.
    cfg = override(vit, {"model.attention": "cudnn", "precision.dtype": "bfloat16"})
    validate(cfg)
    with pytest.raises(ConfigError, match=r"needs an NVIDIA GPU \(cuDNN\), and this platform is cpu") as err:
        nnx.eval_shape(lambda: build_model(cfg, nnx.Rngs(0)))
    assert "\n" not in str(err.value)
    lm = override(get_preset("lm-seed"), {"model.attention": "cudnn", "precision.dtype":
                                                                 "bfloat16"})
    with pytest.raises(ConfigError, match=r"this platform is cpu"):
        nnx.eval_shape(lambda: build_model(lm, nnx.Rngs(0)))


class Device:
    """A device's properties as JAX reports them (the inputs auto's choice reads), for GPUs this machine lacks."""

    def __init__(self, platform: str, kind: str, capability: str, version: str = "cuda 13000") -> None:
        self.platform, self.device_kind, self.compute_capability = platform, kind, capability
        self.client = type("Client", (), {"platform_version": version})()


H100, A100, V100 = (Device("gpu", "NVIDIA H100 80GB HBM3", "9.0"), Device("gpu", "NVIDIA A100-SXM4-80GB", "8.0"),
                    Device("gpu", "Tesla V100-SXM2-16GB", "7.0"))


def test_auto_runs_cudnn_for_the_vit_and_the_lm_where_the_gpu_suite_measured_it_and_cudnn_takes_it() -> None:
    """auto = cudnn for the vit and the lm in 16 bits on an NVIDIA GPU of compute capability 8.0 or later with a
    head dim cuDNN takes (measured 0.91x the vit's step and 0.30x the lm's at sequence 1024 on an H100); fused for a
    model of your own (not measured), in float32, with a head dim cuDNN refuses or on an older GPU; einsum off
    GPUs; the other settings are what they say."""
    vit = override(get_preset("vit-seed"), {"precision.dtype": "bfloat16"})
    lm = override(get_preset("lm-seed"), {"precision.dtype": "bfloat16"})
    for cfg in (vit, lm):
        assert auto_cudnn_problem(cfg, [H100]) is None and auto_cudnn_problem(cfg, [A100]) is None
        assert attention_kind("auto", "gpu", auto_cudnn_problem(cfg, [H100]) is None) == "cudnn"
    refused = {
        "a model of your own": (override(vit, {"model.factory": "mine:build"}), H100, "not measured"),
        "float32": (get_preset("vit-seed"), H100, "16-bit compute dtype"),
        "head dim 36": (override(vit, {"model.embed_dim": 360, "model.num_heads": 10}), H100, "multiple of 8"),
        "lsa": (override(vit, {"model.lsa": True}), H100, "einsum"),
        "a V100": (vit, V100, "compute capability 8.0"),
        "a head dim of 192 on an A100": (override(vit, {"model.num_heads": 2}), A100, "at most 128 before Hopper"),
        "the cpu": (vit, Device("cpu", "cpu", "", version=""), "NVIDIA GPU"),
        "a ROCm gpu": (vit, Device("gpu", "AMD Instinct MI300X", "9.4", version="rocm 6.3"), "NVIDIA GPU"),
    }
    for name, (cfg, device, why) in refused.items():
        said = auto_cudnn_problem(cfg, [device])
        assert said and why in said, (name, said)
        assert attention_kind("auto", "gpu", said is None) == "fused", name
    assert attention_kind("auto", "cpu") == "einsum" and attention_kind("auto", "tpu") == "einsum"
    assert attention_kind("cudnn", "gpu") == "cudnn" and attention_kind("einsum", "gpu") == "einsum"
    assert attention_kind("fused", "cpu") == "fused"


def test_auto_qkv_layout_is_seq_major_where_the_vit_or_lm_runs_cudnn_and_fused_elsewhere(monkeypatch) -> None:
    """--model.qkv-layout auto: seq-major for the vit and the lm when their attention is cuDNN's (measured 0.90x
    the vit's step on an H100, 0.94x the lm's on an H200), fused under the other attentions (seq-major did not move
    XLA's composition); a layout named is the one built. The builder hands the resolved layout to the blocks: on this CPU
    auto's attention is einsum, so auto builds fused."""
    vit = override(get_preset("vit-seed"), {"precision.dtype": "bfloat16"})
    lm = override(get_preset("lm-seed"), {"precision.dtype": "bfloat16"})
    assert vit.model.qkv_layout == lm.model.qkv_layout == "auto"
    assert qkv_layout_kind(vit, "cudnn") == "seq-major"
    assert [qkv_layout_kind(vit, a) for a in ("fused", "einsum")] == ["fused", "fused"]
    assert qkv_layout_kind(lm, "cudnn") == "seq-major" and qkv_layout_kind(lm, "fused") == "fused"
    assert qkv_layout_kind(override(lm, {"parallel.strategy": "dp+cp"}), "cudnn") == "fused"
    assert qkv_layout_kind(override(vit, {"parallel.strategy": "dp+cp"}), "cudnn") == "fused"  # the ring attends
    for layout in ("fused", "split", "seq-major"):
        for kind in ("cudnn", "fused", "einsum"):
            assert qkv_layout_kind(override(vit, {"model.qkv_layout": layout}), kind) == layout
    small = {"model.embed_dim": 32, "model.num_heads": 4, "model.mlp_dim": 64, "model.num_layers": 1}
    built = {layout: nnx.eval_shape(lambda: build_model(override(vit, {**small, "model.qkv_layout": layout}),
                                                          nnx.Rngs(0))).encoder.qkv_layout
             for layout in ("auto", "split", "seq-major")}
    assert built == {"auto": "fused", "split": "split", "seq-major": "seq-major"}
    # Where the attention resolves to cuDNN's (an NVIDIA GPU: stood in for by the resolver alone, as nothing is
    # called here), the builder gives the vit's blocks and the lm's seq-major.
    monkeypatch.setattr(models, "resolve_attention", lambda cfg: "cudnn")
    assert nnx.eval_shape(lambda: build_model(override(vit, small), nnx.Rngs(0))).encoder.qkv_layout == "seq-major"
    lm_small = {**small, "model.vocab_size": 64, "model.seq_len": 16}
    assert nnx.eval_shape(lambda: build_model(override(lm, lm_small), nnx.Rngs(0))).blocks.qkv_layout == "seq-major"


# ------------------------------------------------------------------------------------------------ mean pool
def test_mean_pool_is_counted_by_hand() -> None:
    """vit-seed without the class token: 384 parameters fewer for the token, 384 for the position table's
    65th row; FLOPs with T = 64 tokens."""
    seed = get_preset("vit-seed")
    mean = override(seed, {"model.pool": "mean"})
    m = seed.model
    e, f, n, p, c = m.embed_dim, m.mlp_dim, m.num_layers, m.patch_size, m.num_classes
    patches = (seed.data.image_size // p) ** 2
    per_block = 4 * e * e + 4 * e + 2 * e * f + f + e + 4 * e  # q/k/v/out + biases, MLP, two LayerNorms
    want = (p * p * 3 * e + e) + patches * e + n * per_block + 2 * e + (e * c + c)
    model = nnx.eval_shape(lambda: build_model(mean, nnx.Rngs(0)))
    assert count_params(model) == want == 10_695_562 - 2 * 384
    assert not hasattr(model, "cls_token") and model.pos_embed.shape == (1, 64, 384)
    t = patches
    assert flops_per_example(mean.model, 32)["forward"] == (
        2 * patches * 3 * p * p * e + n * (8 * t * e * e + 4 * t * t * e + 4 * t * e * f) + 2 * e * c)
    assert flops_per_example(seed.model, 32)["forward"] > flops_per_example(mean.model, 32)["forward"]
    with pytest.raises(ConfigError, match=r"--model.pool mean applies to the vit model only, not to model kind "
                                          r"'lm'"):
        validate(override(get_preset("lm-seed"), {"model.pool": "mean"}))
    with pytest.raises(ConfigError, match=r"choose one of cls, mean"):
        validate(override(seed, {"model.pool": "max"}))


@pytest.mark.slow
def test_mean_pool_trains_alike_on_one_and_eight_devices(micro) -> None:
    one = _train(micro(**{**ONE, "model.pool": "mean"}))
    cfg = micro(**{**ONE, "model.pool": "mean", "parallel.strategy": "dp", "parallel.mesh": "8"})
    cfg = override(cfg, {"train.out": str(Path(cfg.train.out).parent / "dp")})
    eight = _train(cfg)
    assert all(math.isfinite(x) for x in one) and len(one) == 4
    assert one[-1] < one[0]
    assert eight == pytest.approx(one, rel=2e-5, abs=2e-6)
    assert json.loads((Path(cfg.train.out) / "config.json").read_text())["model"]["pool"] == "mean"


# ----------------------------------------------------------------------------------------------- qkv layout
@pytest.mark.slow
@pytest.mark.parametrize("layout", ["split", "seq-major"])
def test_qkv_layouts_give_todays_losses(micro, reference, layout: str) -> None:
    cfg = micro(**{**ONE, "model.qkv_layout": layout})
    assert count_params(nnx.eval_shape(lambda: build_model(cfg, nnx.Rngs(0)))) == count_params(
        nnx.eval_shape(lambda: build_model(micro(**ONE), nnx.Rngs(0))))
    assert _train(cfg) == pytest.approx(reference, rel=1e-5, abs=1e-6)
    tp = micro(**{**ONE, "model.qkv_layout": layout, "parallel.strategy": "tp", "parallel.mesh": "model=4",
                  "parallel.devices": 4})
    tp = override(tp, {"train.out": str(Path(tp.train.out).parent / "tp")})
    assert _train(tp) == pytest.approx(reference, rel=2e-5, abs=2e-6)  # the sharded reduction order differs


@pytest.mark.slow
def test_qkv_layouts_give_the_lms_losses_on_one_device_and_under_tp(tmp_path: Path) -> None:
    """The LM's causal blocks take each layout too (auto runs seq-major for the LM under cuDNN's attention since
    2026-11-27): the same losses as the fused projection on one device, and under tp, where the heads are split
    over model, the same again up to the sharded sums' order."""
    small = {"model.embed_dim": 32, "model.num_heads": 4, "model.mlp_dim": 64, "model.num_layers": 1,
             "model.seq_len": 16, "train.batch_size": 8, "train.steps": 3, "train.log_every": 1,
             "train.progress": False, "train.eval": False, "train.checkpoint_every": 0,
             "data.cache_dir": str(tmp_path / "cache")}
    lm = override(get_preset("lm-tiny"), small)
    losses = {}
    for layout in ("fused", "split", "seq-major"):
        for name, layer in (("one", {"parallel.strategy": "single"}),
                            ("tp", {"parallel.strategy": "tp", "parallel.mesh": "model=4", "parallel.devices": 4})):
            losses[layout, name] = _train(override(lm, {**layer, "model.qkv_layout": layout,
                                                        "train.out": str(tmp_path / f"{layout}-{name}")}))
    reference = losses["fused", "one"]
    assert len(reference) == 3
    for (layout, name), got in losses.items():
        assert got == pytest.approx(reference, rel=1e-5 if name == "one" else 2e-5, abs=2e-6), (layout, name)


@pytest.mark.parametrize("layout", ["fused", "split", "seq-major"])
def test_project_qkv_gives_the_numpy_projection_in_every_layout(layout: str) -> None:
    """`project_qkv` against numpy in float64 on the same weights: q, k and v are h times the kernel's slices 0, 1
    and 2 along its third axis, plus the bias's slices (batch 2, 5 tokens, embed 6, 2 heads of 3). A layout that
    mixed up the slices, or their axes, would give another q, k or v."""
    keys = jax.random.split(jax.random.key(0), 3)
    h = jax.random.normal(keys[0], (2, 5, 6), jnp.float32)
    kernel = jax.random.normal(keys[1], (6, 3, 2, 3), jnp.float32)
    bias = jax.random.normal(keys[2], (3, 2, 3), jnp.float32)
    got = project_qkv(h, kernel, bias, layout, jax.lax.Precision.HIGHEST)
    h64, kernel64, bias64 = (np.asarray(x, np.float64) for x in (h, kernel, bias))
    want = [np.einsum("bse,ehd->bshd", h64, kernel64[:, i]) + bias64[i] for i in range(3)]
    assert [x.shape for x in got] == [(2, 5, 2, 3)] * 3
    for g, w in zip(got, want):
        close(g, w)


@pytest.mark.parametrize("layout, want_arrays, want_split_dots",
                         [("fused", {"fused"}, 0), ("split", set(), 3), ("seq-major", {"seq-major"}, 0)])
def test_each_qkv_layout_is_the_one_the_model_lowers(layout: str, want_arrays: set[str],
                                                     want_split_dots: int) -> None:
    """The model takes its --model.qkv-layout: a one-block ViT (batch 2, 17 tokens, embed 32, 4 heads of 8) lowered
    per layout, its program searched for the q/k/v projection the layout documents. fused projects into one
    (3, batch, seq, heads, dim) array, 3x2x17x4x8; seq-major into one (batch, seq, 3, heads, dim), 2x17x3x4x8;
    split makes neither, but three dots from the 2x17x32 activations to 2x17x4x8, one per q, k and v. The
    losses cannot tell (every layout computes the same sums), so a model that ignored the setting passed them.
    (Lowered only, nothing compiled: under a second each.)"""
    inputs = jnp.zeros((2, 32, 32, 3), jnp.float32)
    arrays = {"fused": "tensor<3x2x17x4x8xf32>", "seq-major": "tensor<2x17x3x4x8xf32>"}
    projection = "(tensor<2x17x32xf32>, tensor<32x4x8xf32>) -> tensor<2x17x4x8xf32>"
    base = config_lib.ModelConfig(patch_size=8, embed_dim=32, num_layers=1, num_heads=4, mlp_dim=64, dropout=0.0,
                                  qkv_layout=layout)
    graphdef, params = nnx.split(VisionTransformer(base, image_size=32, attention="einsum", rngs=nnx.Rngs(0)))
    text = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x)).lower(params, inputs).as_text()
    assert {name for name, shape in arrays.items() if shape in text} == want_arrays
    dots = [line for line in text.splitlines() if "dot_general" in line]
    assert sum(projection in line for line in dots) == want_split_dots


def test_unknown_qkv_layout_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"unknown --model.qkv-layout 'packed': choose one of auto, fused, split, "
                                          r"seq-major"):
        validate(override(get_preset("vit-seed"), {"model.qkv_layout": "packed"}))


# -------------------------------------------------------------------------------------- Adam's first moment
def _adam_states(state: Any) -> list[optax.ScaleByAdamState]:
    return [s for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
            if isinstance(s, optax.ScaleByAdamState)]


@pytest.mark.parametrize("optimizer", ["adamw", "adam"])
def test_mu_dtype_sets_the_first_moment_and_its_bytes(micro, optimizer: str) -> None:
    model = build_model(micro(**ONE), nnx.Rngs(0))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    count = count_params(model)
    for mu, param_dtype, want_mu in (("bfloat16", jnp.float32, jnp.bfloat16), ("float32", jnp.float32, jnp.float32),
                                     ("", jnp.float32, jnp.float32), ("", jnp.bfloat16, jnp.bfloat16),
                                     ("float32", jnp.bfloat16, jnp.float32)):
        typed = jax.tree.map(lambda x: x.astype(param_dtype), params)  # noqa: B023
        tx = build_optimizer(config_lib.OptimConfig(optimizer=optimizer, mu_dtype=mu), 10)
        state = tx.init(typed)
        (adam,) = _adam_states(state)
        assert {x.dtype for x in jax.tree.leaves(adam.mu)} == {jnp.dtype(want_mu)}, (mu, param_dtype)
        assert {x.dtype for x in jax.tree.leaves(adam.nu)} == {jnp.dtype(param_dtype)}
        # Memory accounting counts each leaf in its own dtype.
        scalars = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state) if x.ndim == 0)
        want_bytes = count * (jnp.dtype(want_mu).itemsize + jnp.dtype(param_dtype).itemsize) + scalars
        assert per_device_bytes(state) == want_bytes


@pytest.mark.slow
def test_mu_bfloat16_trains_close_to_float32(micro, reference) -> None:
    """Not equal: the first moment is rounded to bfloat16's 8 significant bits at every step (a relative error
    up to 2^-9 in each update), so the losses may drift apart by about that much; four steps stay within 1e-3."""
    cfg = micro(**{**ONE, "optim.mu_dtype": "bfloat16"})
    losses = _train(cfg)
    assert all(math.isfinite(x) for x in losses)
    assert losses == pytest.approx(reference, rel=1e-3)
    assert json.loads((Path(cfg.train.out) / "config.json").read_text())["optim"]["mu_dtype"] == "bfloat16"
    # The run held a bfloat16 first moment: 2 bytes a parameter beside the float32 second moment's 4 (float32
    # parameters are 4 bytes each), and two int32 step counters (Adam's and the schedule's).
    parts = json.loads((Path(cfg.train.out) / "summary.json").read_text())["measurements"]["memory"]["breakdown"]
    assert parts["optimizer_bytes"] == parts["params_bytes"] // 4 * (2 + 4) + 8, parts
    with pytest.raises(ConfigError, match=r"unknown --optim.mu-dtype 'float8': choose one of '', float32, "
                                          r"bfloat16"):
        validate(override(cfg, {"optim.mu_dtype": "float8"}))
