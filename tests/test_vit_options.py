"""The vit's options from published small-dataset ViTs: CCT's convolutional stem and sequence pooling (Hassani et
al. 2021), SPT's shifted patches and Locality Self-Attention (Lee, Lee and Song 2021). Each is counted by hand
(parameters and FLOPs), checked against a direct reference on a tiny input, and refused in one line where it means
nothing. That they train alike on one device and on 8 simulated devices (dp, fsdp+tp, and fsdp under shard_map)
is checked with the recipe they come with: SPT's pieces in tests/test_recipe.py, CCT's in
tests/test_recipe_policies.py."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from shardbench import config as config_lib
from shardbench.errors import ConfigError
from shardbench.models import build_model, count_params
from shardbench.models.transformer import attention, attention_weights
from shardbench.parsing import override
from shardbench.presets import get_preset
from shardbench.validation import inert_notes
from shardbench.models.vit import (VisionTransformer, conv_tokens, flops_per_example, num_tokens, sequence_pool,
                                   shifted_images)
from shardbench.models.spec import param_axes
from shardbench.tasks import validate

CCT = {"model.stem": "conv", "model.pool": "sequence"}
SPT = {"model.stem": "shifted-patch", "model.lsa": True}


def _model(cfg: config_lib.Config) -> nnx.Module:
    return nnx.eval_shape(lambda: build_model(cfg, nnx.Rngs(0)))


def _blocks(e: int, m: int, layers: int) -> int:
    """q/k/v and output projections with biases, the MLP, two LayerNorms."""
    return layers * (4 * e * e + 4 * e + 2 * e * m + m + e + 4 * e)


def _head(e: int, c: int) -> int:
    return 2 * e + e * c + c  # the final LayerNorm and the classifier


# ------------------------------------------------------------------------------------------------- counts
@pytest.mark.parametrize("layers", [1, 2])
def test_conv_stem_and_sequence_pool_are_counted_by_hand(layers: int) -> None:
    cfg = override(get_preset("vit-cifar-cct"), {"model.stem_layers": layers})
    m = cfg.model
    e, f, n, c = m.embed_dim, m.mlp_dim, m.num_layers, m.num_classes
    convs = 9 * 3 * e if layers == 1 else 9 * 3 * 64 + 9 * 64 * e  # 3 -> [64 ->] embed, 3x3, no bias
    side = 32 // 2 ** layers
    tokens = side * side  # no class token
    want = convs + tokens * e + _blocks(e, f, n) + _head(e, c) + (e + 1)  # + the pool's Linear(embed, 1)
    model = _model(cfg)
    assert count_params(model) == want
    assert num_tokens(m, 32) == tokens and model.pos_embed.shape == (1, tokens, e)
    assert not hasattr(model, "cls_token") and not hasattr(model, "patch_kernel")
    if layers == 1:  # CCT-7/3x1: CCT's 3.76M, plus the q/k/v biases of these blocks
        assert want == 3_765_515 == 3_760_139 + n * 3 * e
    # Forward: each conv at the side it sees, the blocks at T tokens, the pool's scores and weighted sum, the head.
    conv_flops = 2 * 32 * 32 * 9 * 3 * e if layers == 1 else 2 * 32 * 32 * 9 * 3 * 64 + 2 * 16 * 16 * 9 * 64 * e
    t = tokens
    blocks = n * (8 * t * e * e + 4 * t * t * e + 4 * t * e * f)
    assert flops_per_example(m, 32) == {"forward": conv_flops + blocks + 4 * t * e + 2 * e * c,
                                        "train": 3 * (conv_flops + blocks + 4 * t * e + 2 * e * c)}


def test_shifted_patches_and_lsa_are_counted_by_hand() -> None:
    cfg = get_preset("vit-cifar-spt")
    m = cfg.model
    e, f, n, c, h, p = m.embed_dim, m.mlp_dim, m.num_layers, m.num_classes, m.num_heads, m.patch_size
    patch = 5 * 3 * p * p  # the image and its four diagonal shifts, each patch flattened
    tokens = (32 // p) ** 2 + 1  # and the class token
    want = 2 * patch + patch * e + e + e + tokens * e + _blocks(e, f, n) + n * h + _head(e, c)
    model = _model(cfg)
    assert count_params(model) == want == 2_735_062
    assert model.encoder.lsa_scale.shape == (n, h)
    t, patches = tokens, tokens - 1
    forward = 2 * patches * patch * e + n * (8 * t * e * e + 4 * t * t * e + 4 * t * e * f) + 2 * e * c
    assert flops_per_example(m, 32)["forward"] == forward
    # LSA alone adds n*h parameters and no FLOPs; the shifted patches alone 5x the stem's matmul.
    seed = get_preset("vit-seed")
    lsa = override(seed, {"model.lsa": True})
    assert count_params(_model(lsa)) == 10_695_562 + seed.model.num_layers * seed.model.num_heads
    assert flops_per_example(lsa.model, 32) == flops_per_example(seed.model, 32)


def test_the_presets_ratios_to_vit_seed() -> None:
    """What the presets' docstrings state: FLOPs per image against vit-seed's, and the length estimates."""
    seed = flops_per_example(get_preset("vit-seed").model, 32)["forward"]
    spt, cct = (flops_per_example(get_preset(name).model, 32)["forward"]
                for name in ("vit-cifar-spt", "vit-cifar-cct"))
    assert round(seed / spt, 1) == 3.7 and round(cct / seed, 2) == 1.66
    measured = 8700 * 512 / 152  # vit-cifar (vit-seed's model) on one H100, bfloat16: images per second
    for name, seconds in (("vit-cifar-spt", 123), ("vit-cifar-cct", 292)):
        cfg = get_preset(name)
        flops = flops_per_example(cfg.model, 32)["forward"]
        steps = 45_000 // (cfg.train.batch_size // cfg.data.repeat_augment) * cfg.train.epochs
        assert steps * cfg.train.batch_size / (measured * seed / flops) == pytest.approx(seconds, abs=1.5), name


def test_every_new_parameter_has_logical_axes() -> None:
    for overrides in (CCT, {**CCT, "model.stem_layers": 2}, SPT):
        cfg = override(get_preset("vit-tiny"), overrides)
        axes = param_axes(nnx.state(_model(cfg), nnx.Param))  # raises if any parameter has none
        if overrides is SPT:
            assert axes["encoder"]["lsa_scale"] == ("layers", "heads")
            assert axes["patch_kernel"] == (None, None, "patch", "embed")
            assert axes["spt_norm_scale"] == ("norm",)
        else:
            last = overrides.get("model.stem_layers", 1) - 1
            assert axes[f"conv{last}_kernel"][-1] == "embed" and axes["conv0_kernel"][2] == "patch"
            assert axes["seq_pool_kernel"] == ("embed", None)


# ----------------------------------------------------------------------------------------------- the stems
def _conv_reference(x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """A 3x3 'same' convolution without bias, ReLU and a 3x3 max-pool of stride 2 padded with -inf, by loops."""
    b, h, w, _ = x.shape
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    conv = np.zeros((b, h, w, kernel.shape[-1]))
    for i in range(h):
        for j in range(w):
            conv[:, i, j] = np.einsum("bxyc,xyco->bo", padded[:, i:i + 3, j:j + 3], kernel)
    conv = np.maximum(conv, 0.0)
    pooled_h, pooled_w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
    big = np.pad(conv, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-np.inf)
    out = np.zeros((b, pooled_h, pooled_w, conv.shape[-1]))
    for i in range(pooled_h):
        for j in range(pooled_w):
            out[:, i, j] = big[:, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max(axis=(1, 2))
    return out


@pytest.mark.parametrize("side", [6, 7])
def test_conv_stem_equals_a_loop_reference(side: int) -> None:
    """Two layers (3 -> 4 -> 5 channels) on a tiny image, odd and even sides; tokens in row-major order."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, side, side, 3))
    k1, k2 = rng.normal(size=(3, 3, 3, 4)), rng.normal(size=(3, 3, 4, 5))
    want = _conv_reference(_conv_reference(x, k1), k2)
    got = conv_tokens(jnp.asarray(x, jnp.float32), [jnp.asarray(k1, jnp.float32), jnp.asarray(k2, jnp.float32)],
                      jax.lax.Precision.HIGHEST)
    assert got.shape == (2, want.shape[1] * want.shape[2], 5)
    np.testing.assert_allclose(got, want.reshape(2, -1, 5), rtol=1e-5, atol=1e-5)


def test_conv_stem_in_the_model() -> None:
    cfg = override(get_preset("vit-tiny"), {**CCT, "model.embed_dim": 8, "model.num_heads": 2,
                                                                  "model.mlp_dim": 8, "model.num_layers": 1,
                                                                  "data.image_size": 8})
    model = build_model(cfg, nnx.Rngs(0))
    x = np.random.default_rng(1).normal(size=(2, 8, 8, 3)).astype(np.float32)
    want = _conv_reference(x, np.asarray(model.conv0_kernel[...])).reshape(2, 16, 8)
    np.testing.assert_allclose(model.stem_tokens(jnp.asarray(x)), want, rtol=1e-5, atol=1e-5)
    assert nnx.eval_shape(lambda: model(jnp.asarray(x))).shape == (2, 10)
    kernel = np.asarray(model.conv0_kernel[...])  # He-normal, PyTorch's kaiming_normal_ as CCT's
    assert abs(kernel.std() / math.sqrt(2.0 / 27) - 1) < 0.25


def test_shifted_copies_of_a_hand_made_image() -> None:
    image = np.arange(1, 17, dtype=np.float32).reshape(1, 4, 4, 1)  # 1..16, row by row
    got = np.asarray(shifted_images(jnp.asarray(image), 1))[0]
    assert got.shape == (4, 4, 5)
    np.testing.assert_array_equal(got[..., 0], image[0, ..., 0])
    want = {  # SPT's order: x_lu[i, j] = x[i-1, j-1], x_ru = x[i-1, j+1], x_lb = x[i+1, j-1], x_rb = x[i+1, j+1]
        1: [[0, 0, 0, 0], [0, 1, 2, 3], [0, 5, 6, 7], [0, 9, 10, 11]],
        2: [[0, 0, 0, 0], [2, 3, 4, 0], [6, 7, 8, 0], [10, 11, 12, 0]],
        3: [[0, 5, 6, 7], [0, 9, 10, 11], [0, 13, 14, 15], [0, 0, 0, 0]],
        4: [[6, 7, 8, 0], [10, 11, 12, 0], [14, 15, 16, 0], [0, 0, 0, 0]],
    }
    for channel, rows in want.items():
        np.testing.assert_array_equal(got[..., channel], np.asarray(rows, np.float32), err_msg=str(channel))


def test_shifted_patch_stem_in_the_model() -> None:
    """Shift by p/2 = 1, patches of 2x2x15 flattened (row, column, channel), LayerNorm, projection: by numpy."""
    cfg = override(get_preset("vit-tiny"), {"model.stem": "shifted-patch", "model.patch_size": 2,
                                                                  "model.embed_dim": 8, "model.num_heads": 2,
                                                                  "model.mlp_dim": 8, "model.num_layers": 1,
                                                                  "data.image_size": 4})
    model = build_model(cfg, nnx.Rngs(0))
    model.spt_norm_scale[...] = jnp.linspace(0.5, 1.5, 60)
    model.spt_norm_bias[...] = jnp.linspace(-0.1, 0.1, 60)
    x = np.random.default_rng(2).normal(size=(1, 4, 4, 3)).astype(np.float32)
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    stacked = np.concatenate([x, padded[:, :4, :4], padded[:, :4, 2:], padded[:, 2:, :4], padded[:, 2:, 2:]], -1)
    vectors = np.stack([stacked[0, i:i + 2, j:j + 2].reshape(-1) for i in (0, 2) for j in (0, 2)])
    normed = (vectors - vectors.mean(-1, keepdims=True)) / np.sqrt(vectors.var(-1, keepdims=True) + 1e-6)
    normed = normed * np.linspace(0.5, 1.5, 60) + np.linspace(-0.1, 0.1, 60)
    want = normed @ np.asarray(model.patch_kernel[...]).reshape(60, 8) + np.asarray(model.patch_bias[...])
    np.testing.assert_allclose(model.stem_tokens(jnp.asarray(x))[0], want, rtol=1e-5, atol=1e-5)
    assert nnx.eval_shape(lambda: model(jnp.asarray(x))).shape == (1, 10)


# --------------------------------------------------------------------------------------------- the pooling
def test_sequence_pool_weights_sum_to_one_and_match_a_hand_computation() -> None:
    rng = np.random.default_rng(3)
    x, kernel, bias = rng.normal(size=(2, 5, 4)), rng.normal(size=(4, 1)), rng.normal(size=(1,))
    pooled, weights = sequence_pool(jnp.asarray(x, jnp.float32), jnp.asarray(kernel, jnp.float32),
                                    jnp.asarray(bias, jnp.float32), jax.lax.Precision.HIGHEST)
    np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, rtol=1e-6)
    scores = x @ kernel[:, 0] + bias[0]
    want_weights = np.exp(scores - scores.max(-1, keepdims=True))
    want_weights /= want_weights.sum(-1, keepdims=True)
    np.testing.assert_allclose(weights, want_weights, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pooled, np.einsum("bt,bte->be", want_weights, x), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------ locality self-attention
def _qkv(seed: int = 4) -> tuple[jax.Array, ...]:
    keys = jax.random.split(jax.random.key(seed), 3)
    return tuple(jax.random.normal(key, (2, 5, 3, 4), jnp.float32) for key in keys)  # batch, seq, heads, dim


def test_lsa_masks_the_diagonal_and_scales_per_head() -> None:
    q, k, v = _qkv()
    highest = jax.lax.Precision.HIGHEST
    scale = jnp.asarray([0.5, 1.0, 2.0])
    weights = np.asarray(attention_weights(q, k, precision=highest, scale=scale, mask_diagonal=True))
    assert (weights[:, :, np.arange(5), np.arange(5)] == 0).all()  # exactly: no token attends to itself
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    scores = np.einsum("bqhd,bkhd->bhqk", np.asarray(q), np.asarray(k)) * np.asarray(scale)[:, None, None]
    scores[:, :, np.arange(5), np.arange(5)] = -np.inf
    want = np.exp(scores - scores.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(weights, want, rtol=1e-5, atol=1e-6)
    out = attention(q, k, v, kind="einsum", precision=highest, scale=scale, mask_diagonal=True)
    np.testing.assert_allclose(out, np.einsum("bhqk,bkhd->bqhd", want, np.asarray(v)), rtol=1e-5, atol=1e-6)


def test_lsa_at_its_initial_temperature_without_the_mask_is_the_einsum_attention() -> None:
    q, k, v = _qkv(5)
    highest = jax.lax.Precision.HIGHEST
    plain = attention(q, k, v, kind="einsum", precision=highest)
    scaled = attention(q, k, v, kind="einsum", precision=highest, scale=jnp.full((3,), 1 / math.sqrt(4)))
    np.testing.assert_allclose(scaled, plain, rtol=1e-6, atol=1e-6)
    # In the model: the scale starts at 1/sqrt(head_dim) on every layer and head, and auto's fused turns einsum.
    cfg = override(get_preset("vit-tiny"), {"model.lsa": True})
    model = nnx.eval_shape(lambda: VisionTransformer(cfg.model, image_size=32, attention="fused", rngs=nnx.Rngs(0)))
    assert model.encoder.attention == "einsum"
    built = build_model(override(cfg, {"model.num_layers": 2}), nnx.Rngs(0))
    np.testing.assert_array_equal(built.encoder.lsa_scale[...], np.full((2, 4), 1 / math.sqrt(128 // 4), np.float32))


# --------------------------------------------------------------------------------------------- refusals
def test_refusals_are_one_line() -> None:
    vit, lm, mlp = (get_preset(name) for name in ("vit-seed", "lm-seed", "mlp-small"))
    own = override(vit, {"model.factory": "examples/convnet.py:build", "model.task": "classify"})
    cases = [
        (vit, {"model.stem": "pixels"}, r"unknown --model.stem 'pixels': choose one of patch, conv, shifted-patch"),
        (vit, {"model.pool": "max"}, r"unknown --model.pool 'max': choose one of cls, mean, sequence"),
        (lm, {"model.stem": "conv"}, r"--model.stem conv applies to the vit model only, not to model kind 'lm'"),
        (mlp, {"model.lsa": True}, r"--model.lsa applies to the vit model only, not to model kind 'mlp'"),
        (lm, {"model.pool": "sequence"}, r"--model.pool sequence applies to the vit model only"),
        (own, {"model.stem": "shifted-patch"}, r"--model.stem shifted-patch applies to the vit model only, not to a "
                                               r"model of your own \(--model examples/convnet.py:build\)"),
        (own, {"model.lsa": True}, r"--model.lsa applies to the vit model only, not to a model of your own"),
        (vit, {"model.lsa": True, "model.attention": "fused"}, r"runs on the einsum attention only, not "
                                                               r"--model.attention fused"),
        (vit, {"model.lsa": True, "model.attention": "cudnn", "precision.dtype": "bfloat16"},
         r"not --model.attention cudnn: use --model.attention einsum"),
        (vit, {"model.stem": "shifted-patch", "model.patch_size": 1}, r"--model.patch-size 1 has no half"),
        (vit, {"model.stem": "conv", "model.stem_layers": 0}, r"--model.stem-layers must be in \(0, 2\^31\)"),
    ]
    for base, overrides, message in cases:
        with pytest.raises(ConfigError, match=message) as err:
            validate(override(base, overrides))
        assert "\n" not in str(err.value), overrides
    for overrides in ({**CCT, "model.stem_layers": 2, "data.image_size": 30}, {**SPT, "model.attention": "auto"},
                      {**SPT, "model.attention": "einsum"}):
        validate(override(vit, overrides))  # the conv stem needs no patch that divides the image
    notes = inert_notes(override(vit, {"model.stem_layers": 2}))
    assert notes == ["--model.stem-layers 2 does nothing here: it counts the conv stem's layers, and --model.stem is "
                     "patch"]
    notes = inert_notes(override(get_preset("vit-cifar-cct"), {"model.patch_size": 8}))
    assert notes == ["--model.patch-size 8 does nothing here: --model.stem conv makes its tokens by convolution, not "
                     "patches"]
