"""The named presets: each a function that returns a `Config`; an experiment derives from one with
`parsing.override` (or `dataclasses.replace`), never by editing globals."""

from __future__ import annotations

from collections.abc import Callable

from shardbench.config import Config, DataConfig, ModelConfig, OptimConfig, TrainConfig
from shardbench.errors import ConfigError


def vit_seed() -> Config:
    """The seed posts' ViT: patch 4, embed 384, 6 layers, 8 heads, MLP 1536: 10,695,562 parameters."""
    return Config(preset="vit-seed")


def vit_small() -> Config:
    """Half the seed's width: a fair CPU benchmark that still looks like a ViT."""
    return Config(
        preset="vit-small",
        model=ModelConfig(embed_dim=192, num_layers=6, num_heads=4, mlp_dim=768, dropout=0.0),
    )


def vit_tiny() -> Config:
    """A ViT small enough to train on CIFAR-10 (--data cifar10; synthetic images by default) for a few epochs on
    two CPU cores."""
    return Config(
        preset="vit-tiny",
        model=ModelConfig(embed_dim=128, num_layers=4, num_heads=4, mlp_dim=256, dropout=0.0),
        train=TrainConfig(epochs=3, batch_size=128, checkpoint_every=200),
    )


def vit_cifar() -> Config:
    """vit-seed's model (10.7M parameters) with a recipe for CIFAR-10 accuracy, all on the device: a padded random
    crop and flip, TrivialAugment, mixup or CutMix between pairs, label smoothing and stochastic depth;
    AdamW, cosine, 100 epochs at batch 512 (the GPU target: 90% test accuracy in 5 minutes of training)."""
    return Config(
        preset="vit-cifar",
        data=DataConfig(dataset="cifar10", crop="pad", crop_pad=4, trivial_augment=True, mixup=1.0, cutmix=0.5),
        model=ModelConfig(dropout=0.0, drop_path=0.1),
        optim=OptimConfig(lr=1e-3, weight_decay=0.05, warmup_steps=-1),
        train=TrainConfig(epochs=100, batch_size=512, label_smoothing=0.1, checkpoint_every=2000),
    )


def vit_cifar_spt() -> Config:
    """A candidate beside vit-cifar following the training recipe of the SPT/LSA ViT code (Lee, Lee and Song, 2021,
    "Vision Transformer for Small-Size Datasets": 93.6% on CIFAR-10 with their tokenizer and attention): their
    model, Shifted Patch Tokenization (--model.stem shifted-patch) and Locality Self-Attention (--model.lsa) at
    their ViT's shape (width 192, depth 9, 12 heads, MLP ratio 2, patch 4, a class token: 2,735,062 parameters,
    3.7x fewer FLOPs per image than vit-seed by `vit.flops_per_example`), AdamW lr 1e-3 and weight decay 0.05, 10
    warm-up epochs, cosine, label smoothing 0.1, drop-path 0.1, the padded crop and flip, AutoAugment's CIFAR-10
    policy, random erasing 0.25 filled with the mean (as their RandomErasing), mixup 1.0 / CutMix 1.0 applied to
    half of the pairs (half of those cut), repeated augmentation x3, 100 epochs (their code's default).

    Its length on one H100 is an estimate, not a measurement (no GPU has run this preset): vit-cifar's measured
    ~29,300 images/s (8,700 steps of 512 in 152 s, bfloat16) scaled by FLOPs per image gives ~110,000 images/s (a
    narrow model reaches a lower MFU than vit-cifar's, so the true rate is likely lower). Batch 384 = 128 distinct
    images x 3, 45,000 // 128 = 351 steps per epoch, 100 epochs = 35,100 steps = 13.5M images = about 123 s by that
    estimate, inside the 5-minute budget with room to spare; the warm-up is 10 epochs = 3,510 steps."""
    return Config(
        preset="vit-cifar-spt",
        data=DataConfig(dataset="cifar10", crop="pad", crop_pad=4, autoaugment=True, random_erasing=0.25,
                        erasing_fill="mean", mixup=1.0, cutmix=0.5, mix_prob=0.5, repeat_augment=3),
        model=ModelConfig(embed_dim=192, num_layers=9, num_heads=12, mlp_dim=384, patch_size=4, dropout=0.0,
                          drop_path=0.1, stem="shifted-patch", lsa=True),
        optim=OptimConfig(lr=1e-3, weight_decay=0.05, warmup_steps=3510),
        train=TrainConfig(epochs=100, batch_size=384, label_smoothing=0.1, checkpoint_every=5000),
    )


def vit_cifar_cct() -> Config:
    """A candidate beside vit-cifar following the CIFAR recipe of Compact Transformers (Hassani et al., 2021,
    "Escaping the Big Data Paradigm with Compact Transformers": CCT-7/3x1 94.8%, ViT-Lite-7/4 91.4% in 200 epochs),
    with their model, CCT-7/3x1: the convolutional tokenizer with one layer (--model.stem conv: a 3x3 convolution, ReLU, a 3x3
    max-pool of stride 2, so 16x16 = 256 tokens), sequence pooling (--model.pool sequence), 7 layers of width 256,
    4 heads, MLP ratio 2: 3,765,515 parameters (CCT's 3.76M and the 5,376 q/k/v biases of this ViT's blocks), 1.66x
    the FLOPs per image of vit-seed by `vit.flops_per_example` (256 tokens against 65, at two thirds of the width);
    AdamW lr 5.5e-4 and weight decay 0.06, 10 warm-up epochs, cosine, label smoothing 0.1, drop-path 0.1, the
    padded crop and flip, AutoAugment's CIFAR-10 policy, random erasing 0.25 (timm's noise fill), mixup at alpha 0.8
    with CutMix on half of the pairs (CCT's CutMix alpha is 1.0; here one alpha serves both), and mixing turned off
    for the last 40% of the steps.

    Its length on one H100 is an estimate, not a measurement (no GPU has run this preset): vit-cifar's measured
    ~29,300 images/s (bfloat16) scaled by FLOPs per image gives ~17,600 images/s. Batch 256, 45,000 // 256 = 175
    steps per epoch, 115 epochs = 20,125 steps = 5.15M images = about 292 s by that estimate (CCT's 200 epochs would
    take about 510 s); the warm-up is 10 epochs = 1,750 steps."""
    return Config(
        preset="vit-cifar-cct",
        data=DataConfig(dataset="cifar10", crop="pad", crop_pad=4, autoaugment=True, random_erasing=0.25,
                        mixup=0.8, cutmix=0.5, mix_until=0.6),
        model=ModelConfig(embed_dim=256, num_layers=7, num_heads=4, mlp_dim=512, dropout=0.0, drop_path=0.1,
                          stem="conv", stem_layers=1, pool="sequence"),
        optim=OptimConfig(lr=5.5e-4, weight_decay=0.06, warmup_steps=1750),
        train=TrainConfig(epochs=115, batch_size=256, label_smoothing=0.1, checkpoint_every=5000),
    )


def lm_seed() -> Config:
    """The seed's Transformer LM: vocabulary 512, sequence 64, width 256, 8 heads, 4 layers, MLP 1024,
    batch 32, AdamW 3e-4, 50 steps on 8,192 uniformly random sequences."""
    return Config(
        preset="lm-seed",
        data=DataConfig(dataset="tokens-uniform", synthetic_train=8192, synthetic_test=1024),
        model=ModelConfig(kind="lm", embed_dim=256, num_layers=4, num_heads=8, mlp_dim=1024, dropout=0.0,
                          vocab_size=512, seq_len=64),
        optim=OptimConfig(lr=3e-4, weight_decay=1e-4, schedule="constant", warmup_steps=0, grad_clip=0.0),
        train=TrainConfig(steps=50, batch_size=32, log_every=10, checkpoint_every=0),
    )


def lm_tiny() -> Config:
    """A byte-level LM small enough to learn a text file (--data text:PATH; uniform random tokens by default) on two
    CPU cores in a few hundred steps."""
    return Config(
        preset="lm-tiny",
        data=DataConfig(dataset="tokens-uniform", synthetic_train=4096, synthetic_test=512),
        model=ModelConfig(kind="lm", embed_dim=128, num_layers=2, num_heads=4, mlp_dim=512, dropout=0.0,
                          vocab_size=256, seq_len=64),
        optim=OptimConfig(lr=1e-3, weight_decay=1e-4, warmup_steps=10),
        train=TrainConfig(steps=200, batch_size=32, log_every=20, checkpoint_every=0),
    )


def lm_moe() -> Config:
    """lm-seed with a mixture of experts in each block: 8 experts of MLP width 512, each token routed to its top 2,
    capacity factor 1.25, load-balancing loss weighted 0.01 (Switch's); 4 blocks of width 256, batch 32."""
    return Config(
        preset="lm-moe",
        data=DataConfig(dataset="tokens-uniform", synthetic_train=8192, synthetic_test=1024),
        model=ModelConfig(kind="lm", embed_dim=256, num_layers=4, num_heads=8, mlp_dim=512, dropout=0.0,
                          vocab_size=512, seq_len=64, num_experts=8, top_k=2, capacity_factor=1.25,
                          aux_loss_coef=0.01),
        optim=OptimConfig(lr=3e-4, weight_decay=1e-4, schedule="constant", warmup_steps=0, grad_clip=0.0),
        train=TrainConfig(steps=50, batch_size=32, log_every=10, checkpoint_every=0),
    )


def mlp_seed() -> Config:
    """The seed's deep MLP: 90 ReLU layers of width 2056 on 1024 inputs, 10 outputs, mean squared error,
    Adam 1e-4, batch 256 x 27 = 6,912 (about 380M parameters: a GPU preset)."""
    return Config(
        preset="mlp-seed",
        data=DataConfig(dataset="regression", synthetic_train=6912 * 4, synthetic_test=6912),
        model=ModelConfig(kind="mlp", num_layers=90, mlp_dim=2056, input_dim=1024, num_classes=10, dropout=0.0),
        optim=OptimConfig(optimizer="adam", lr=1e-4, schedule="constant", warmup_steps=0, grad_clip=0.0),
        train=TrainConfig(steps=20, batch_size=6912, log_every=5, checkpoint_every=0),
    )


def mlp_small() -> Config:
    """The seed's MLP scaled for a CPU: 24 ReLU layers of width 512 on 256 inputs, batch 1024."""
    return Config(
        preset="mlp-small",
        data=DataConfig(dataset="regression", synthetic_train=16384, synthetic_test=2048),
        model=ModelConfig(kind="mlp", num_layers=24, mlp_dim=512, input_dim=256, num_classes=10, dropout=0.0),
        optim=OptimConfig(optimizer="adam", lr=1e-4, schedule="constant", warmup_steps=0, grad_clip=0.0),
        train=TrainConfig(steps=20, batch_size=1024, log_every=5, checkpoint_every=0),
    )


PRESETS: dict[str, Callable[[], Config]] = {
    "vit-seed": vit_seed,
    "vit-small": vit_small,
    "vit-tiny": vit_tiny,
    "vit-cifar": vit_cifar,
    "vit-cifar-spt": vit_cifar_spt,
    "vit-cifar-cct": vit_cifar_cct,
    "lm-seed": lm_seed,
    "lm-tiny": lm_tiny,
    "lm-moe": lm_moe,
    "mlp-seed": mlp_seed,
    "mlp-small": mlp_small,
}


def get_preset(name: str) -> Config:
    """A fresh copy of the preset `name`, or one line listing the presets."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset '{name}': choose one of {', '.join(PRESETS)}")
    return PRESETS[name]()


__all__ = ["PRESETS", "get_preset"]
