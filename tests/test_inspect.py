"""`shardbench inspect`: the parameter table and the picture of an array over the mesh."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardbench.cli import main


def test_inspect_prints_layout_of_every_parameter(capsys) -> None:
    code = main(["inspect", "--preset", "vit-seed", "--mesh", "4x2", "--array", "encoder/mlp2_kernel"])
    out = capsys.readouterr().out
    assert code == 0
    assert "strategy dp+tp" in out and "10,695,562 params" in out
    row = next(line for line in out.splitlines() if line.startswith("encoder/mlp2_kernel "))
    assert "(6, 1536, 384)" in row and "P(None, 'model', None)" in row and "(6, 768, 384)" in row
    # The second MLP layer is split by rows over the model axis: devices 0,2,4,6 hold rows 0:768.
    assert "0:768 | dev 0,2,4,6 |" in out and "768:1536 | dev 1,3,5,7 |" in out


def test_inspect_says_which_attention_and_q_k_v_projection_will_run(capsys) -> None:
    """auto resolved on these devices, as the run record will say it: on a CPU the einsum attention and so the
    fused projection; a layout named is the one shown; the mlp has no attention to show."""
    assert main(["inspect", "--preset", "vit-tiny"]) == 0
    assert "attention: einsum (--model.attention auto); q/k/v projection: fused (--model.qkv-layout auto)" in (
        capsys.readouterr().out)
    assert main(["inspect", "--preset", "lm-tiny", "--model.attention", "fused", "--model.qkv-layout",
                 "seq-major"]) == 0
    assert "attention: fused (--model.attention fused); q/k/v projection: seq-major (--model.qkv-layout " \
           "seq-major)" in capsys.readouterr().out
    assert main(["inspect", "--preset", "mlp-small"]) == 0
    assert "q/k/v projection" not in capsys.readouterr().out


def test_inspect_rejects_an_unknown_array(capsys) -> None:
    code = main(["inspect", "--preset", "vit-tiny", "--array", "encoder/nothing"])
    assert code == 2 and "--array encoder/nothing: no such parameter" in capsys.readouterr().err


def test_inspect_shows_where_zero2_puts_optimizer_state_and_gradients(capsys) -> None:
    """mlp-small (6,177,802 parameters) under zero2 on 8 devices: every parameter whole, its optimizer state and
    gradient split over data where 8 divides a dim (all but out_bias, 10 values), counted by hand."""
    code = main(["inspect", "--preset", "mlp-small", "--strategy", "zero2", "--mesh", "8"])
    out = capsys.readouterr().out
    assert code == 0 and "strategy zero2" in out
    param, placed = [line for line in out.splitlines() if line.startswith("hidden_kernel ")][:2]  # then its picture
    assert "P(None, None, None)" in param and param.split()[-1] == "24,117,248"  # whole on every device
    assert placed.split("  ")[0] == "hidden_kernel" and placed.count("P(None, 'data', None)  (23, 64, 512)") == 2
    sliced = (6_177_802 - 10) // 8 + 10  # per device: 1/8 of each array but out_bias
    assert (f"optimizer state (adam): {2 * sliced * 4 + 2 * 4:,} bytes per device; parameters: "
            f"{6_177_802 * 4:,} bytes per device; gradients: {sliced * 4:,} bytes per device") in out


# Layouts `shardbench train` refuses that inspect used to accept (or fail on with an internal error): it made a
# subset of train's checks, and now makes the same ones (`preflight.check_parallel`).
MODEL = ["--preset", "vit-tiny", "--model.embed-dim", "32", "--model.num-layers", "2", "--model.mlp-dim", "64",
         "--model.num-heads", "4"]
TRAIN = ["--data", "synthetic", "--data.synthetic-train", "512", "--data.synthetic-test", "128", "--steps", "4",
         "--no-train.progress"]
REFUSED_BY_TRAIN = [
    (["--strategy", "dp", "--mesh", "8", "--batch-size", "30"],
     "--batch-size 30 is not divisible by the data-parallel size 8", 2),  # was IndivisibleError, exit 70
    (["--strategy", "pp", "--mesh", "stage=2", "--devices", "2", "--batch-size", "32", "--train.grad-accum", "3"],
     "--train.grad-accum 3 does not divide the 32 examples per data shard", 2),  # was 2 microbatches of 5 examples
    (["--strategy", "fsdp", "--mesh", "8", "--spmd", "pmap", "--batch-size", "32"],
     "--spmd pmap replicates parameters on every device", 2),
    (["--strategy", "pp", "--mesh", "stage=2", "--devices", "2", "--batch-size", "32", "--model.dropout", "0.1"],
     "--model.dropout would draw the same masks for every microbatch", 2),
    # the dataset's checks, which read no data: inspect printed a layout for each of these, exit 0
    (["--data", "bogus"], "unknown dataset 'bogus'", 2),
    (["--data", "tokens-uniform"], "--data tokens-uniform is a dataset for the lm model, not vit", 2),
    (["--data", "text:/nonexistent.txt"], "/nonexistent.txt does not exist", 4),
    (["--data", "cifar10", "--data.image-size", "64"], "cifar10 images are 32x32 but the model expects 64x64", 2),
]


@pytest.mark.parametrize(("flags", "says", "code"), REFUSED_BY_TRAIN, ids=[s for _, s, _ in REFUSED_BY_TRAIN])
def test_inspect_refuses_what_train_refuses_in_the_same_line(flags: list[str], says: str, code: int, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    train = main(["train", *MODEL, *TRAIN, *flags, "--out", str(out), "--data.cache-dir", str(tmp_path / "cache")])
    said_by_train = capsys.readouterr().err.strip()
    inspected = main(["inspect", *MODEL, *flags])
    said_by_inspect = capsys.readouterr().err.strip()
    assert train == inspected == code, (said_by_train, said_by_inspect)
    assert said_by_inspect == said_by_train and says in said_by_inspect
    assert "\n" not in said_by_inspect and not out.exists()


def test_inspect_names_the_axes_a_mesh_splits(capsys) -> None:
    """'4x2' is data x model; a mesh over expert (whose name has an x in it) is named by its own axes."""
    assert main(["inspect", "--preset", "lm-moe", "--mesh", "data=2,expert=4", "--strategy", "dp+ep"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "mesh data=2,expert=4 (data x expert);" in first, first
    assert main(["inspect", "--preset", "vit-tiny", "--mesh", "4x2", "--strategy", "dp+tp"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "mesh 4x2 (data x model);" in first and "--spmd" not in first
    # a style other than jit is named: the layout is the same, the programs are not
    assert main(["inspect", "--preset", "vit-tiny", "--mesh", "4x2", "--strategy", "dp+tp", "--spmd", "shard_map"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("; 8 cpu device(s); --spmd shard_map")


def test_inspect_names_the_training_options_it_never_reads(capsys) -> None:
    """--prices, --steps and the like change nothing inspect prints: one note on stderr names them (it took them
    without a word, a price table given for nothing); the options it reads (the batch, its accumulation) are not
    named, and with none given there is no note."""
    assert main(["inspect", "--preset", "vit-tiny", "--prices", "/nonexistent/prices.toml", "--steps", "5",
                 "--train.grad-accum", "2", "--batch-size", "64"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["shardbench: note: --prices, --steps do nothing here: inspect lays out the parameters and the "
                   "batch, and trains, measures, saves and prices nothing"]
    assert main(["inspect", "--preset", "vit-tiny", "--batch-size", "64"]) == 0
    assert capsys.readouterr().err == ""
    # An option this layout never reads is said as train says it (inspect said nothing of --devices 2 under single)
    assert main(["inspect", "--preset", "vit-tiny", "--devices", "2", "--strategy", "single"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("shardbench: note: --parallel.devices 2 does nothing here: strategy "
                                               "single trains on one device"), err


def test_inspect_says_when_fsdp_leaves_most_of_the_model_whole(capsys) -> None:
    """mlp-small with a hidden width of 500 on 8 devices: no dim of hidden_kernel (23 x 500 x 500; its layers dim is
    never split) divides by 8, and neither do the biases' or out_kernel's, so fsdp leaves them whole on every
    device, all but in_kernel (its input dim of 256 divides): counted by hand, 5,895,010 - 256 x 500 elements of
    5,895,010 are 98%. With the preset's width of 512, 8 divides everything large and nothing is said."""
    assert main(["inspect", "--preset", "mlp-small", "--strategy", "fsdp", "--mesh", "8",
                 "--model.mlp-dim", "500"]) == 0
    out = capsys.readouterr().out
    kept = (5_895_010 - 256 * 500) / 5_895_010
    assert f"{kept:.0%}" == "98%"
    assert ("note: fsdp splits hidden_kernel (23, 500, 500), hidden_bias (23, 500), out_kernel (500, 10) and 2 more "
            "over data in no dim, since no dim it may split divides by 8, so they stay whole in every device's "
            "parameters, optimizer state and gradients (98% of the model's elements)") in out
    assert main(["inspect", "--preset", "mlp-small", "--strategy", "zero1", "--mesh", "8",
                 "--model.mlp-dim", "500"]) == 0
    assert "so they stay whole in every device's optimizer state (98%" in capsys.readouterr().out
    assert main(["inspect", "--preset", "mlp-small", "--strategy", "fsdp", "--mesh", "8"]) == 0
    assert "stay whole" not in capsys.readouterr().out


def test_a_microbatch_count_that_does_not_divide_is_answered_with_the_counts_nearest_it(capsys) -> None:
    """mlp-small's 1,024 examples over 4 stages, 3 microbatches asked: the divisors of 1,024 nearest 3 are 2, 4, 8,
    16 and 32 (the advice named the five largest, 64 to 1,024: microbatches of 16 examples down to one)."""
    assert main(["inspect", "--preset", "mlp-small", "--mesh", "stage=4", "--strategy", "pp", "--model.num-layers",
                 "25", "--parallel.microbatches", "3"]) == 2
    assert "use --parallel.microbatches 2 or 4 or 8 or 16 or 32, or a batch of 1026" in capsys.readouterr().err


def test_the_optimizer_line_says_when_it_holds_an_ema_of_the_weights(capsys) -> None:
    """--optim.ema adds a copy of the weights to the optimizer's state (mlp-small: 24,711,208 bytes of float32
    parameters, and a 4-byte count), which the line credited to Adam alone."""
    assert main(["inspect", "--preset", "mlp-small"]) == 0
    plain = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("optimizer state"))
    assert main(["inspect", "--preset", "mlp-small", "--optim.ema", "0.999"]) == 0
    ema = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("optimizer state"))
    assert plain.startswith("optimizer state (adam): ") and ema.startswith(
        "optimizer state (adam, with an EMA of the weights): ")

    def opt_bytes(line: str) -> int:
        return int(line.split(": ")[1].split(" bytes")[0].replace(",", ""))

    assert opt_bytes(ema) - opt_bytes(plain) == 24_711_208 + 4
