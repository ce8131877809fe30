"""Sweep files (`shardbench sweep --sweep-file F`): TOML, or JSON by a .json suffix, read into a SweepFile.

    preset = "vit-tiny"                                   # the run preset every run starts from
    axes = [[{"parallel.mesh" = "8x1"}, {"parallel.mesh" = "4x2", "parallel.strategy" = "dp+tp"}]]
    grid = {"train.batch_size" = [128, 1024]}             # shorthand: one axis per field, in file order
    [base]                                                # fixed overrides
    train.steps = 20

Field names are 'section.field', quoted or as TOML dotted keys; values are typed as the field is.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shardbench.errors import ConfigError, DataError
from shardbench.presets import PRESETS
from shardbench.sweep.grid import Axis, Override, SweepFile, check_key, once, typed_value

KEYS = ("preset", "base", "axes", "grid")


def _flatten(table: Mapping[str, Any], prefix: str = "") -> Override:
    """TOML's dotted keys (`train.steps = 20`) arrive as nested tables; quoted keys arrive flat."""
    out: Override = {}
    for k, v in table.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[check_key(f"{prefix}{k}")] = v
    return out


def _typed_table(table: Any) -> Override:
    if not isinstance(table, Mapping):
        raise ConfigError("base and every axis entry must be tables of field = value")
    return {k: typed_value(k, v) for k, v in _flatten(table).items()}


def parse_sweep(data: Any, label: str) -> SweepFile:
    """Check and type a sweep file's content: unknown keys, fields and ill-typed values are one-line errors."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a table with {', '.join(KEYS)} at the top level")
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigError(f"unknown key '{unknown[0]}': use {', '.join(KEYS)}")
    preset = data.get("preset")
    if preset is not None and (not isinstance(preset, str) or preset not in PRESETS):
        raise ConfigError(f"preset '{preset}' is not a run preset: choose one of {', '.join(PRESETS)}")
    raw_axes = data.get("axes", [])
    if not isinstance(raw_axes, list) or not all(isinstance(a, list) and a for a in raw_axes):
        raise ConfigError("axes must be a list of non-empty lists of tables")
    named: list[tuple[str, Axis]] = [(f"axes[{i}]", once(f"axes[{i}]", [_typed_table(entry) for entry in axis]))
                                     for i, axis in enumerate(raw_axes)]
    grid = data.get("grid", {})
    if not isinstance(grid, Mapping):
        raise ConfigError("grid must be a table of field = [values]")
    for key, values in _flatten(grid).items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"grid entry '{key}' must be a non-empty list of values")
        where = f"grid entry '{key}'"
        named.append((where, once(where, [{key: typed_value(key, v)} for v in values])))
    raw_base = data.get("base", {})
    if isinstance(raw_base, Mapping) and "preset" in raw_base:
        raise ConfigError("'preset' is inside [base]: a TOML key written after a [base] header belongs to that table; "
                          "put `preset = ...` above [base]")
    base = _typed_table(raw_base)
    _check_one_place(named, base)
    return SweepFile(label=label, preset=preset, base=base, axes=[axis for _, axis in named])


def _check_one_place(named: list[tuple[str, Axis]], base: Override) -> None:
    """Each field is swept by one axis: where two set it, the later replaced the earlier's values in every run, and
    a [base] value that every entry of an axis sets is never used."""
    first: dict[str, str] = {}
    for where, axis in named:
        for key in dict.fromkeys(k for entry in axis for k in entry):
            if key in first:
                raise ConfigError(f"'{key}' is swept by {first[key]} and by {where}: the second would replace the "
                                  f"first's values in every run; list all its values in one of them")
            first[key] = where
            if key in base and all(key in entry for entry in axis):
                raise ConfigError(f"'{key}' is fixed in [base] and swept by {where}, which sets it in every run: "
                                  f"keep it in one of them")


def load_sweep_file(path: Path) -> SweepFile:
    """Read and check a sweep file; every problem is one line naming the file."""
    kind = "JSON" if path.suffix == ".json" else "TOML"
    try:
        text = path.read_text()
        return parse_sweep(json.loads(text) if kind == "JSON" else tomllib.loads(text), label=path.stem)
    except OSError as e:
        raise ConfigError(f"--sweep-file {path}: cannot be read ({e.strerror})") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        # A file that is not TOML/JSON is a corrupt file (exit 4); what it says, once read, is configuration.
        raise DataError(f"--sweep-file {path}: not valid {kind} ({e})") from None
    except ConfigError as e:
        raise ConfigError(f"--sweep-file {path}: {e}") from None
