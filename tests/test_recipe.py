"""The CIFAR recipe: each augmentation against a reference (numpy, Pillow, a hand count), soft targets,
stochastic depth, the weights' moving average, and every strategy and SPMD style training on the same images."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from PIL import Image, ImageEnhance, ImageOps

from shardbench import config as config_lib
from shardbench.data import recipe
from shardbench.models.transformer import drop_rows
from shardbench.parsing import override
from shardbench.presets import get_preset
from shardbench.train.loop import run
from shardbench.optim import ema_params, track_ema
from shardbench.validation import validate

RNG = np.random.default_rng(7)
IMAGE = RNG.integers(0, 256, (32, 32, 3)).astype(np.uint8)


def _op(name: str, magnitude: float, sign: float = 1.0) -> np.ndarray:
    """`trivial_augment` with op `name` at `magnitude` (sign +1 or -1), on IMAGE."""
    u = jnp.array([(recipe.OPS.index(name) + 0.5) / len(recipe.OPS), magnitude, 0.75 if sign > 0 else 0.25])
    return np.asarray(recipe.trivial_augment(jnp.asarray(IMAGE, jnp.float32), u))


def test_padded_crop_and_flip_are_exact_shifts() -> None:
    """Against numpy: pad 4 zeros, take the 32x32 window at the drawn offset, mirror when drawn."""
    padded = np.pad(IMAGE, ((4, 4), (4, 4), (0, 0)))
    for u0, u1, u2 in [(0.0, 0.99, 0.9), (0.5, 0.5, 0.1), (0.99, 0.2, 0.7)]:
        got = np.asarray(recipe.pad_crop_flip(jnp.asarray(IMAGE, jnp.float32), jnp.array([u0, u1, u2]), 4, True))
        dy, dx = int(u0 * 9), int(u1 * 9)  # offsets 0..8 into the padded image
        want = padded[dy:dy + 32, dx:dx + 32]
        want = want[:, ::-1] if u2 < 0.5 else want
        np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize(("name", "pillow"), [
    ("brightness", lambda im, f: ImageEnhance.Brightness(im).enhance(f)),
    ("contrast", lambda im, f: ImageEnhance.Contrast(im).enhance(f)),
    ("saturation", lambda im, f: ImageEnhance.Color(im).enhance(f)),
])
def test_colour_ops_match_pillow(name: str, pillow: object) -> None:
    """Pillow's ImageEnhance at the same factor (1 + 0.99 x signed magnitude), within Pillow's rounding (its
    contrast takes the grey mean rounded to an integer)."""
    for magnitude, sign in [(0.6, 1.0), (0.4, -1.0)]:
        factor = 1.0 + recipe.ENHANCE * magnitude * sign
        want = np.asarray(pillow(Image.fromarray(IMAGE), factor), np.float32)  # type: ignore[operator]
        got = _op(name, magnitude, sign)
        assert np.abs(got - want).max() <= 2.0, (name, magnitude, np.abs(got - want).max())


def test_solarize_posterize_autocontrast_match_pillow() -> None:
    got = _op("solarize", 0.5)  # threshold 128
    np.testing.assert_array_equal(got, np.asarray(ImageOps.solarize(Image.fromarray(IMAGE), 128), np.float32))
    got = _op("posterize", 0.5)  # 8 - round(0.5 x 6) = 5 bits
    np.testing.assert_array_equal(got, np.asarray(ImageOps.posterize(Image.fromarray(IMAGE), 5), np.float32))
    low = (IMAGE // 2 + 40).astype(np.uint8)
    u = jnp.array([(recipe.OPS.index("autocontrast") + 0.5) / len(recipe.OPS), 0.5, 0.75])
    got = np.asarray(recipe.trivial_augment(jnp.asarray(low, jnp.float32), u))
    want = np.asarray(ImageOps.autocontrast(Image.fromarray(low)), np.float32)
    assert np.abs(got - want).max() <= 1.0


def test_geometric_ops() -> None:
    """Identity is exact; a translation by a whole number of pixels is an exact shift with grey fill; a
    rotation matches Pillow's (counter-clockwise, bilinear, grey fill) within its rounding, inside the image."""
    np.testing.assert_array_equal(_op("identity", 0.7), IMAGE.astype(np.float32))
    magnitude = 3.0 / (recipe.TRANSLATE * 32)  # 3 pixels
    got = _op("translate_x", magnitude)
    want = np.full_like(IMAGE, 128, dtype=np.float32)
    want[:, 3:] = IMAGE[:, :-3]
    np.testing.assert_allclose(got, want, atol=1e-3)
    yy, xx = np.mgrid[0:32, 0:32]  # a smooth image: bilinear sampling then differs only by rounding
    smooth = np.stack([yy * 8, xx * 8, (yy + xx) * 4], -1).clip(0, 255).astype(np.uint8)
    u = jnp.array([(recipe.OPS.index("rotate") + 0.5) / len(recipe.OPS), 0.5, 0.75])
    got = np.asarray(recipe.trivial_augment(jnp.asarray(smooth, jnp.float32), u))
    want = np.asarray(Image.fromarray(smooth).rotate(recipe.ROTATE_DEG * 0.5, resample=Image.BILINEAR,
                                                     fillcolor=(128, 128, 128)), np.float32)
    inner = (slice(6, 26), slice(6, 26))
    assert np.abs(got[inner] - want[inner]).max() <= 1.0


def test_mixup_and_cutmix_of_a_pair_by_hand() -> None:
    """Images 0 and 1 filled with 0 and 100. Mixup at lam: lam x own + (1 - lam) x partner, own weight lam.
    CutMix: the box is the partner's, own weight 1 - the box's share of the pixels."""
    images = jnp.stack([jnp.zeros((8, 8, 1)), jnp.full((8, 8, 1), 100.0)])
    lam = jnp.array([0.3, 0.9])  # the pair uses its first row's draws
    out, own = recipe.mix_pairs(images, jnp.array([[0.9, 0.5, 0.5], [0.0, 0.0, 0.0]]), lam, cutmix=0.5)
    np.testing.assert_allclose(out[0], 70.0, rtol=1e-6)  # 0.3 x 0 + 0.7 x 100
    np.testing.assert_allclose(out[1], 30.0, rtol=1e-6)  # 0.3 x 100 + 0.7 x 0
    np.testing.assert_allclose(own, [0.3, 0.3])
    out, own = recipe.mix_pairs(images, jnp.array([[0.1, 0.5, 0.5], [0.0, 0.0, 0.0]]), lam, cutmix=0.5)
    # Box side sqrt(0.7) x 8 = 6.69 centred at (4, 4): rows and columns round(0.65)=1 .. round(7.35)=7.
    box = np.zeros((8, 8), bool)
    box[1:7, 1:7] = True
    np.testing.assert_array_equal(np.asarray(out[0, ..., 0]), np.where(box, 100.0, 0.0))
    np.testing.assert_array_equal(np.asarray(out[1, ..., 0]), np.where(box, 0.0, 100.0))
    np.testing.assert_allclose(own, [1 - 36 / 64] * 2, rtol=1e-6)


def test_soft_targets_follow_the_pixels_and_sum_to_one() -> None:
    """Each image is one flat value, 10 x (its row + 1): after mixing, its mean says how much of it is its own,
    (mean - partner's value) / (own value - partner's value), whether mixup blended it or CutMix pasted a box. The
    soft targets, drawn apart from the pixels, must weigh the two labels by exactly that."""
    data = config_lib.DataConfig(mixup=1.0, cutmix=0.5, image_size=32)
    labels = jnp.array([1, 4, 2, 2, 7, 0, 3, 9, 5, 6, 8, 1])
    b, key = len(labels), jax.random.key(3)
    rows = (0, b)
    soft = np.asarray(recipe.soft_targets(data, labels, 10, 0.1, key, rows))
    np.testing.assert_allclose(soft.sum(-1), 1.0, rtol=1e-6)
    values = 10.0 * (np.arange(b) + 1)
    images = jnp.stack([jnp.full((32, 32, 1), v) for v in values])
    u, lam = recipe.mix_draws(data, key, rows, b)
    mixed = np.asarray(recipe.mix_pairs(images, u, lam, 0.5)[0])
    pasted = [i for i in range(b) if len(np.unique(mixed[i])) == 2]  # CutMix: two values; mixup: one
    assert 0 < len(pasted) < b, pasted  # both kinds of mixing are covered
    for i in range(b):
        partner = i ^ 1
        own = (mixed[i].mean() - values[partner]) / (values[i] - values[partner])
        want = np.full(10, 0.01)
        want[int(labels[i])] += 0.9 * own
        want[int(labels[partner])] += 0.9 * (1 - own)
        np.testing.assert_allclose(soft[i], want, rtol=1e-4, atol=1e-6, err_msg=f"row {i}")


@pytest.mark.slow
def test_draws_are_sliced_from_the_global_batch() -> None:
    """A program holding rows 4..7 of 8 augments them as the whole batch's program does."""
    data = get_preset("vit-cifar").data
    images = jnp.asarray(RNG.integers(0, 256, (8, 32, 32, 3)), jnp.uint8)
    key = jax.random.key(11)
    whole = recipe.recipe_images(data, images, key, (0, 8))
    part = recipe.recipe_images(data, images[4:], key, (4, 8))
    np.testing.assert_allclose(part, whole[4:], rtol=1e-6, atol=1e-4)


def test_stochastic_depth_drops_whole_rows_at_its_rate() -> None:
    x = jnp.ones((20_000, 3, 2))
    seed = jax.random.bits(jax.random.key(0), (2,), jnp.uint32)
    out = np.asarray(drop_rows(x, jnp.float32(0.2), seed))
    dropped = (out == 0).all(axis=(1, 2))
    assert set(np.unique(out)) == {0.0, 1.25}  # kept rows scaled by 1 / (1 - 0.2)
    sigma = math.sqrt(0.2 * 0.8 / 20_000)
    assert abs(dropped.mean() - 0.2) < 5 * sigma
    np.testing.assert_array_equal(np.asarray(drop_rows(x, jnp.float32(0.0), seed)), 1.0)


@pytest.mark.parametrize("decay", [0.9, 0.2])  # 0.2 caps the warm-up's d_t from t = 2 on (3/12 > 0.2); 0.9 never
def test_weights_moving_average_by_hand(decay: float) -> None:
    """SGD at lr 0.1 on w = 1 with gradient 1: w_t = 1 - 0.1 t; the average with d_t = min(decay, (1+t)/(10+t))."""
    tx = optax.chain(optax.sgd(0.1), track_ema(decay))
    params = {"w": jnp.array(1.0)}
    state = tx.init(params)
    ema = 1.0
    for t in range(5):
        updates, state = tx.update({"w": jnp.array(1.0)}, state, params)
        params = optax.apply_updates(params, updates)
        d = min(decay, (1 + t) / (10 + t))
        ema = d * ema + (1 - d) * float(params["w"])
    assert float(ema_params(state)["w"]) == pytest.approx(ema, rel=1e-6)
    assert ema_params(optax.sgd(0.1).init(params)) is None


def _losses(out: Path) -> list[float]:
    rows = [json.loads(line) for line in (out / "tensorboard" / "metrics.jsonl").read_text().splitlines()]
    return [r["train/loss"] for r in rows if "train/loss" in r]


RECIPE = {"data.crop": "pad", "data.trivial_augment": True, "data.mixup": 1.0, "data.cutmix": 0.5,
          "train.label_smoothing": 0.1, "model.drop_path": 0.1, "optim.ema": 0.99, "train.eval": True,
          "data.synthetic_test": 64}


# vit-cifar-spt's model pieces: shifted patches (8 wide, so half-patch shifts of 4) and Locality Self-Attention.
SPT_MODEL = {"model.stem": "shifted-patch", "model.lsa": True}


@pytest.mark.slow
def test_every_strategy_trains_on_the_same_augmented_images(micro) -> None:
    """The whole recipe (crop, TrivialAugment, mixup/CutMix, smoothing, stochastic depth, the moving average) on a
    ViT with SPT's shifted-patch tokenizer and LSA gives one device's losses and test loss (evaluated on the
    average) under dp and fsdp+tp, and, without stochastic depth, under fsdp as shard_map."""
    recipe = {**RECIPE, **SPT_MODEL}
    reference = run(micro(**recipe, **{"parallel.strategy": "single", "train.out": micro().train.out + "-single"}))
    base = _losses(Path(micro().train.out + "-single"))
    assert len(base) == 4
    for name, overrides in {"dp": {"parallel.strategy": "dp", "parallel.mesh": "8"},
                            "fsdp_tp": {"parallel.strategy": "fsdp+tp", "parallel.mesh": "4x2"}}.items():
        out = micro().train.out + "-" + name
        summary = run(micro(**recipe, **overrides, **{"train.out": out}))
        assert _losses(Path(out)) == pytest.approx(base, rel=2e-5, abs=2e-6), name
        assert summary["test_loss"] == pytest.approx(reference["test_loss"], rel=2e-5), name
    # shard_map draws dropout and stochastic-depth masks per device: the rest is compared step by step.
    no_path = {**recipe, "model.drop_path": 0.0}
    run(micro(**no_path, **{"parallel.strategy": "single", "train.out": micro().train.out + "-jit"}))
    run(micro(**no_path, **{"parallel.strategy": "fsdp", "parallel.mesh": "8", "parallel.spmd": "shard_map",
                            "train.out": micro().train.out + "-map"}))
    assert _losses(Path(micro().train.out + "-map")) == pytest.approx(
        _losses(Path(micro().train.out + "-jit")), rel=2e-5, abs=2e-6)


def test_mixing_needs_pairs_on_one_device(micro) -> None:
    from shardbench.errors import ConfigError
    from shardbench.preflight import check_runnable

    with pytest.raises(ConfigError, match="--data.mixup mixes the images of pairs"):
        check_runnable(micro(**{"data.mixup": 1.0, "train.batch_size": 24, "parallel.strategy": "dp",
                                "parallel.mesh": "8"}))
    with pytest.raises(ConfigError, match="--data.cutmix 0.5 needs --data.mixup > 0"):
        validate(micro(**{"data.cutmix": 0.5}))


def test_recipe_flags_are_refused_where_they_mean_nothing() -> None:
    for preset, overrides, flag in [("lm-tiny", {"data.mixup": 1.0}, "--data.mixup"),
                                    ("mlp-small", {"train.label_smoothing": 0.1}, "--train.label-smoothing"),
                                    ("mlp-small", {"model.drop_path": 0.1}, "--model.drop-path"),
                                    # cutmix alone on the mlp: refused as image-only, not sent to add --data.mixup
                                    # (which the mlp then refuses too)
                                    ("mlp-small", {"data.cutmix": 1.0}, "--data.cutmix applies to image")]:
        from shardbench.errors import ConfigError

        with pytest.raises(ConfigError, match=flag):
            validate(override(get_preset(preset), overrides))


@pytest.mark.slow
def test_mixing_pairs_moves_nothing_between_devices(micro) -> None:
    """Under jit with the batch split over 8 devices, swapping pair partners is a reshape within each device's
    rows: the compiled step has the same collectives with mixing as without."""
    from shardbench.plan.compile import compile_candidate

    def collectives(mixup: float) -> list[tuple[str, int, int]]:
        cfg = micro(**{"parallel.strategy": "dp", "parallel.mesh": "8", "data.crop": "pad", "data.mixup": mixup,
                       "data.cutmix": 0.5 if mixup else 0.0})
        r = compile_candidate(cfg, link_span=8)
        return sorted((c["kind"], c["count"], c["bytes"]) for c in r["collectives"])

    assert collectives(1.0) == collectives(0.0)
