"""Command-line flags for configuration fields: one `--section.field` flag per field (dashes or underscores), and
the short spelling a field declares (`--batch-size` for `--train.batch-size`), each with the help, choices and
range its declaration holds (`config.SPECS`); the parsed arguments back into a Config; and the docs' flag table
(`python -m shardbench.flags --markdown`). Shared by `train`, `inspect` and `sweep`.
"""

from __future__ import annotations

import argparse
import sys
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from shardbench import config as config_lib
from shardbench.errors import ConfigError
from shardbench.fields import Spec, count, list_refusal
from shardbench.parsing import override
from shardbench.presets import PRESETS, get_preset

PRESET_HELP = "starting configuration (default: vit-seed); flags override its fields"


def long_flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def metavar(kind: Any) -> str:
    return "A,B" if typing.get_origin(kind) is tuple else getattr(kind, "__name__", "X").upper()


def described(spec: Spec, default: Any, default_text: str | None = None) -> str:
    """A field's help with what its declaration adds: the vit-seed default (or `default_text`, a command's own
    reading of the field, in which '{default}' stands for vit-seed's), the choices and the range."""
    extras = [default_text.format(default=repr(default)) if default_text else f"vit-seed: {default!r}"]
    if spec.choices:
        extras.append(("each one of: " if spec.comma_list else "choices: ") + spec.choices_text())
    if spec.range is not None:
        extras.append(f"range {spec.range.text()}")
    return f"{spec.help} ({'; '.join(extras)})"


def add_config_arguments(parser: argparse.ArgumentParser, lists: Mapping[str, str] | None = None) -> None:
    """One argument per Config field; a short flag is an alternative spelling of the same argument. `lists`: the
    fields a command takes comma lists of (plan, tune), each with what its help says of that list (`described`)."""
    lists = lists or {}
    parser.add_argument("--preset", default=argparse.SUPPRESS, choices=sorted(PRESETS), help=PRESET_HELP)
    group = None
    for key, (kind, default, spec) in config_lib.declarations().items():
        section, _, name = key.partition(".")
        if group is None or group.title != f"{section} options":
            group = parser.add_argument_group(f"{section} options")
        flags = [long_flag(key)] + ([f"--{key}"] if "_" in name else [])
        if spec.short:
            flags.insert(0, spec.short)
        help_text = described(spec, default, lists.get(key)).replace("%", "%%")  # argparse formats help with %
        if kind is bool:
            group.add_argument(*flags, dest=key, action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS, help=help_text)
        else:
            group.add_argument(*flags, dest=key, default=argparse.SUPPRESS, metavar=metavar(kind), help=help_text,
                               action="append" if spec.repeatable else "store")


def config_from_args(args: argparse.Namespace) -> config_lib.Config:
    values: dict[str, Any] = {k: ",".join(v) if isinstance(v, list) else v for k, v in vars(args).items() if "." in k}
    cfg = get_preset(getattr(args, "preset", "vit-seed"))
    return override(cfg, values)


def given_fields(args: argparse.Namespace) -> frozenset[str]:
    """The configuration fields the command line named ('train.epochs' for --epochs), whatever their values: only
    those are in `args` (every field's default is left out)."""
    return frozenset(k for k in vars(args) if "." in k)


def comma_lists(args: argparse.Namespace, flags: dict[str, str]) -> dict[str, list[str]]:
    """The comma lists given to the configuration fields `flags` names (key -> its flag), for commands that take
    several values where a run takes one (plan, tune), each value checked against the field's declaration (its
    choices, or a whole number in its range); `args` is left holding the first value of each."""
    out: dict[str, list[str]] = {}
    declared = config_lib.declarations()
    for key, flag in flags.items():
        given = getattr(args, key, None)
        if given is None:
            continue
        values = [v.strip() for v in str(given).split(",") if v.strip()]
        if not values:
            raise ConfigError(f"{flag} '{given}': give one value or a comma list")
        kind, _, spec = declared[key]
        refusal = list_refusal(flag, values, choices=spec.choices, range=spec.range, integers=kind is int)
        if refusal:
            raise ConfigError(refusal)
        out[key] = values
        setattr(args, key, values[0])
    return out


def parse_ints(flag: str, text: str) -> tuple[int, ...]:
    """A comma list of whole numbers from 1 to below 2^31, each once, or one line naming the flag."""
    values = tuple(dict.fromkeys(v.strip() for v in str(text).split(",") if v.strip()))
    refusal = list_refusal(flag, values, range=count(1), integers=True) if values else (
        f"{flag} '{text}': give one value or a comma list")
    if refusal:
        raise ConfigError(refusal)
    return tuple(int(v) for v in values)


def parse_names(flag: str, text: str, choices: Sequence[str]) -> tuple[str, ...]:
    """A comma list of names from `choices`, each once, or one line naming the flag and the choices."""
    values = tuple(dict.fromkeys(v.strip() for v in str(text).split(",") if v.strip()))
    refusal = list_refusal(flag, values, choices=choices) if values else (
        f"{flag} '{text}': give one value or a comma list")
    if refusal:
        raise ConfigError(refusal)
    return values


def setup_devices(cfg: config_lib.Config) -> None:
    """Simulate the devices a run of its own asks for (`--devices N` on a CPU)."""
    # Must run before anything asks JAX for devices.
    if cfg.parallel.devices > 0:
        from shardbench.devices import simulate_devices

        simulate_devices(cfg.parallel.devices)


def _cell(text: str) -> str:
    """Text as one markdown table cell: a bar would end the cell, and <name> would be read as HTML."""
    return text.replace("|", "\\|").replace("<", "&lt;")


def markdown_table() -> str:
    """docs/flags.md: every configuration flag with its short spelling, type, vit-seed default, choices or range,
    and help, written from the declarations (tests/test_flags_doc.py keeps the committed page equal to this)."""
    lines = ["# Configuration flags", "",
             "Every field of the configuration (`src/shardbench/config.py`) is a flag of `shardbench train`, "
             "`inspect` and `sweep`. This page is written by `python -m shardbench.flags --markdown > docs/flags.md` "
             "from the fields' declarations, which `--help` and the validation also read; do not edit it by hand.",
             "", f"`--preset NAME`: {PRESET_HELP}; one of {', '.join(f'`{p}`' for p in PRESETS)}.",
             "", "A flag of a bool field also has a `--no-` form (`--no-data.flip`). Short spellings set the same "
             "field:", "", "| short | field |", "|---|---|"]
    lines += [f"| `{spec.short}` | `{long_flag(key)}` |" for key, (_, _, spec) in config_lib.declarations().items()
              if spec.short]
    section = ""
    for key, (kind, default, spec) in config_lib.declarations().items():
        if key.partition(".")[0] != section:
            section = key.partition(".")[0]
            lines += ["", f"## {section}", "", "| flag | type | vit-seed | allowed | meaning |", "|---|---|---|---|---|"]
        flag = f"`{long_flag(key)}`" + (f", `{spec.short}`" if spec.short else "")
        if kind is bool:
            flag += f", `--no-{key.replace('_', '-')}`"
        if spec.choices:
            allowed = ("each of " if spec.comma_list else "") + ", ".join(f"`{c}`" if c else "`''`"
                                                                          for c in spec.choices)
        else:
            allowed = spec.range.text() if spec.range is not None else ""
        shown = ",".join(f"{v:g}" for v in default) if isinstance(default, tuple) else str(default)
        lines.append(f"| {flag} | {metavar(kind).lower()} | `{shown or chr(39) * 2}` | {_cell(allowed)} | "
                     f"{_cell(spec.help)} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shardbench.flags",
                                     description="Print the configuration flags' table (docs/flags.md).")
    parser.add_argument("--markdown", action="store_true", required=True, help="print docs/flags.md")
    parser.parse_args(argv)
    sys.stdout.write(markdown_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
