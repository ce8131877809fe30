"""docs/flags.md is the table the fields' declarations write: a field added, renamed, re-described or given other
choices or another range without regenerating the page fails here."""

from __future__ import annotations

from pathlib import Path

from shardbench import config as config_lib
from shardbench.flags import markdown_table

PAGE = Path(__file__).resolve().parents[1] / "docs" / "flags.md"


def test_the_committed_flag_table_is_the_generated_one() -> None:
    assert PAGE.read_text() == markdown_table(), (
        "docs/flags.md differs from the declarations: run `python -m shardbench.flags --markdown > docs/flags.md`")


def test_the_table_has_every_field_with_its_choices_and_range() -> None:
    page = PAGE.read_text()
    for key, spec in config_lib.SPECS.items():
        row = next(line for line in page.splitlines() if line.startswith(f"| `--{key.replace('_', '-')}`"))
        for choice in spec.choices:
            assert f"`{choice or chr(39) * 2}`" in row, (key, choice)
        if spec.range is not None:
            assert spec.range.text() in row, key


def test_plan_and_tune_help_give_the_defaults_of_their_comma_lists() -> None:
    """plan and tune read --remat as a list whose default is none and block, not the preset's single 'none'."""
    import argparse

    from shardbench.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name in ("plan", "tune"):
        remat = next(a for a in commands[name]._actions if a.dest == "model.remat")
        assert "here a comma list; default: 'none,block'" in remat.help and "vit-seed: 'none'" not in remat.help
    train = next(a for a in commands["train"]._actions if a.dest == "model.remat")
    assert "vit-seed: 'none'" in train.help
