"""Augmentation policies as data: AutoAugment's CIFAR-10 policy and the op lists that RandAugment and
AutoAugment draw from (the ops themselves are `shardbench.data.recipe.apply_op`).

The CIFAR-10 policy is the one Cubuk et al. (2019) found by search and torchvision ships
(`AutoAugmentPolicy.CIFAR10`): 25 sub-policies of two ops, each op applied with its probability at its level
(0-9 of 10 bins; None for the ops without a strength). An image gets one sub-policy, drawn uniformly.
"""

from __future__ import annotations

# (op, probability, level) pairs; op names are recipe.ALL_OPS names (torchvision's Color is saturation).
AUTOAUGMENT_CIFAR10: tuple[tuple[tuple[str, float, int | None], tuple[str, float, int | None]], ...] = (
    (("invert", 0.1, None), ("contrast", 0.2, 6)),
    (("rotate", 0.7, 2), ("translate_x", 0.3, 9)),
    (("sharpness", 0.8, 1), ("sharpness", 0.9, 3)),
    (("shear_y", 0.5, 8), ("translate_y", 0.7, 9)),
    (("autocontrast", 0.5, None), ("equalize", 0.9, None)),
    (("shear_y", 0.2, 7), ("posterize", 0.3, 7)),
    (("saturation", 0.4, 3), ("brightness", 0.6, 7)),
    (("sharpness", 0.3, 9), ("brightness", 0.7, 9)),
    (("equalize", 0.6, None), ("equalize", 0.5, None)),
    (("contrast", 0.6, 7), ("sharpness", 0.6, 5)),
    (("saturation", 0.7, 7), ("translate_x", 0.5, 8)),
    (("equalize", 0.3, None), ("autocontrast", 0.4, None)),
    (("translate_y", 0.4, 3), ("sharpness", 0.2, 6)),
    (("brightness", 0.9, 6), ("saturation", 0.2, 8)),
    (("solarize", 0.5, 2), ("invert", 0.0, None)),
    (("equalize", 0.2, None), ("autocontrast", 0.6, None)),
    (("equalize", 0.2, None), ("equalize", 0.6, None)),
    (("saturation", 0.9, 9), ("equalize", 0.6, None)),
    (("autocontrast", 0.8, None), ("solarize", 0.2, 8)),
    (("brightness", 0.1, 3), ("saturation", 0.7, 0)),
    (("solarize", 0.4, 5), ("autocontrast", 0.9, None)),
    (("translate_y", 0.9, 9), ("translate_y", 0.7, 9)),
    (("autocontrast", 0.9, None), ("solarize", 0.8, 3)),
    (("equalize", 0.8, None), ("invert", 0.1, None)),
    (("translate_y", 0.7, 9), ("autocontrast", 0.9, None)),
)
AUTOAUGMENT_BINS = 10  # levels 0..9: level L is L/9 of the op's strongest setting

# The ops the CIFAR-10 policy uses, "identity" first (what an op that was not applied becomes).
AUTOAUGMENT_OPS: tuple[str, ...] = ("identity", "invert", "contrast", "rotate", "translate_x", "sharpness", "shear_y",
                                    "translate_y", "autocontrast", "equalize", "posterize", "saturation",
                                    "brightness", "solarize")

# RandAugment's ops as torchvision's RandAugment has them (no invert), drawn uniformly and with replacement.
RANDAUGMENT_OPS: tuple[str, ...] = ("identity", "shear_x", "shear_y", "translate_x", "translate_y", "rotate",
                                    "brightness", "saturation", "contrast", "sharpness", "posterize", "solarize",
                                    "autocontrast", "equalize")
RANDAUGMENT_MAX = 30  # magnitude M in [0, 30] is M/30 of each op's strongest setting (torchvision's 31 bins)
