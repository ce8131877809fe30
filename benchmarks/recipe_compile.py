"""What each piece of the CIFAR recipe adds to the train step's compile time, on this machine.

    python benchmarks/recipe_compile.py [--preset vit-tiny] [--rounds 2]
    python benchmarks/recipe_compile.py --presets vit-seed,vit-cifar,vit-cifar-spt,vit-cifar-cct --batch-size 24

Compiles the step of `--preset` (one device, the persistent cache off) with the seed's augmentation, then with
each recipe piece alone, then with the whole recipe, in alternating rounds, and prints the median compile
time of each against the seed's. With `--presets`, compiles each named preset's own step (its model and
recipe) instead, against the first. Nothing is run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

PIECES: dict[str, dict[str, object]] = {
    "seed (resized crop, flip)": {},
    "pad crop": {"data.crop": "pad"},
    "TrivialAugment": {"data.trivial_augment": True},
    "mixup": {"data.mixup": 1.0},
    "mixup + CutMix": {"data.mixup": 1.0, "data.cutmix": 0.5},
    "label smoothing": {"train.label_smoothing": 0.1},
    "stochastic depth": {"model.drop_path": 0.1},
    "whole recipe": {"data.crop": "pad", "data.trivial_augment": True, "data.mixup": 1.0, "data.cutmix": 0.5,
                     "train.label_smoothing": 0.1, "model.drop_path": 0.1},
}


def compile_seconds(preset: str, overrides: dict[str, object]) -> float:
    from shardbench.devices import select_devices
    from shardbench.parallel.rules import make_layout
    from shardbench.parsing import override
    from shardbench.plan.compile import abstract_batch
    from shardbench.presets import get_preset
    from shardbench.tasks import get_task
    from shardbench.optim import build_optimizer
    from shardbench.train.spmd import make_steps
    from shardbench.models.spec import describe_model
    from shardbench.train.state import abstract_train_state

    cfg = override(get_preset(preset), {"parallel.strategy": "single", "parallel.mesh": "none", **overrides})
    layout = make_layout("single", "none", select_devices(1))
    spec = describe_model(cfg)
    tx = build_optimizer(cfg.optim, 1000)
    batch = abstract_batch(cfg, layout)
    steps = make_steps(cfg, get_task(cfg), spec, layout, tx, ("image", "label"))
    start = time.perf_counter()
    steps.train.lower(abstract_train_state(spec, layout, tx), batch).compile()
    return time.perf_counter() - start


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="vit-tiny")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--presets", default="", help="comma-separated presets, each compiled as it is, against "
                                                      "the first (instead of --preset's pieces)")
    parser.add_argument("--batch-size", type=int, default=0, help="the global batch (0: each preset's own)")
    args = parser.parse_args(argv)
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    batch = {"train.batch_size": args.batch_size} if args.batch_size else {}
    if args.presets:
        cases = {name: (name, batch) for name in args.presets.split(",")}
        what, against = "each preset's", "against the first"
    else:
        cases = {name: (args.preset, {**pieces, **batch}) for name, pieces in PIECES.items()}
        what, against = f"{args.preset}", "against the seed's"
    times: dict[str, list[float]] = {name: [] for name in cases}
    for round_ in range(args.rounds):
        names = list(cases) if round_ % 2 == 0 else list(reversed(cases))
        for name in names:
            times[name].append(compile_seconds(*cases[name]))
    base = statistics.median(next(iter(times.values())))
    print(f"| {what} train step, one {jax.devices()[0].platform} device | compile (median of "
          f"{args.rounds}) | {against} |")
    print("|---|---:|---:|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} s | {median / base - 1:+.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
