"""`shardbench inspect`: the parameter table and the picture of an array over the mesh."""

from __future__ import annotations

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


def test_inspect_rejects_an_unknown_array(capsys) -> None:
    code = main(["inspect", "--preset", "vit-tiny", "--array", "encoder/nothing"])
    assert code == 2 and "--array encoder/nothing: no such parameter" in capsys.readouterr().err


def test_inspect_shows_where_zero2_puts_optimizer_state_and_gradients(capsys) -> None:
    """Parameters whole, each one's optimizer state and gradient split over data, with the bytes per device."""
    code = main(["inspect", "--preset", "mlp-small", "--strategy", "zero2", "--mesh", "8"])
    out = capsys.readouterr().out
    assert code == 0 and "strategy zero2" in out
    param = next(line for line in out.splitlines() if line.startswith("hidden_kernel "))
    assert "P(None, None, None)" in param  # the parameter stays whole on every device
    placed = [line.split() for line in out.splitlines() if line.startswith("hidden_kernel ")][1]
    shape = next(line for line in out.splitlines() if line.startswith("hidden_kernel ")).split("(")[3]
    assert placed[0] == "hidden_kernel" and "'data'" in " ".join(placed), placed
    params, opt, grads = (int(out.split(f"{part}: ")[1].split(" bytes")[0].replace(",", ""))
                          for part in ("parameters", "optimizer state (adamw)", "gradients"))
    assert grads * 8 <= params + 8 * 64 and opt < params / 2, (params, opt, grads, shape)
