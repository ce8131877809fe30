"""Values from text and mappings into a `Config`: command-line text to a field's type, `{'section.field': value}`
overrides applied to a configuration, and a saved config.json read back."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from shardbench import config as config_lib
from shardbench.config import RANGES, SECTIONS, TASK_KINDS, Config, field_types
from shardbench.errors import ConfigError
from shardbench.fields import SWEEP_HINT, a_list_of


def parse_value(key: str, text: str, kind: Any) -> Any:
    """Turn command-line text into a field's type, or say in one line what would be right."""
    try:
        if kind is bool:
            lowered = text.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        if typing.get_origin(kind) is tuple:
            parts = [float(p) for p in text.split(",")]
            if len(parts) != len(typing.get_args(kind)):
                raise ValueError(text)
            return tuple(parts)
        return str(text)
    except ValueError:
        name = getattr(kind, "__name__", str(kind))
        allowed = RANGES.get(key)  # the field's range, where it has one: what would be right
        raise ConfigError(f"--{key.replace('_', '-')}: '{text}' is not a valid {name}"
                          + (f": give one in {allowed.text()}" if allowed is not None else "")
                          + (SWEEP_HINT if a_list_of(text, lambda item: _parses(key, item, kind)) else "")) from None


def _parses(key: str, text: str, kind: Any) -> bool:
    try:
        parse_value(key, text, kind)
    except ConfigError:
        return False
    return True


def override(cfg: Config, values: Mapping[str, Any]) -> Config:
    """Apply {'section.field': value} overrides (values already typed or as command-line text)."""
    sections = {name: getattr(cfg, name) for name in SECTIONS}
    preset = cfg.preset
    for key, value in values.items():
        if key == "preset":
            preset = str(value)
            continue
        section, _, name = key.partition(".")
        if section not in sections or name not in field_types(type(sections[section])):
            raise config_lib.unknown_field(key)
        kind = field_types(type(sections[section]))[name]
        typed = parse_value(key, value, kind) if isinstance(value, str) and kind is not str else value
        if typing.get_origin(kind) is tuple and isinstance(typed, list):
            typed = tuple(typed)
        sections[section] = dataclasses.replace(sections[section], **{name: typed})
    model = sections["model"]
    if model.task in TASK_KINDS and model.kind != TASK_KINDS[model.task]:  # the task decides the data and loss
        sections["model"] = dataclasses.replace(model, kind=TASK_KINDS[model.task])
    return Config(preset=preset, **sections)


def from_dict(data: Mapping[str, Any]) -> Config:
    """Rebuild a Config from its to_dict() form (e.g. a run directory's config.json); anything else (a list, a
    section that is not a table of fields) is one line, not an AttributeError."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"a configuration is a table of sections ({', '.join(SECTIONS)}), not a "
                          f"{type(data).__name__}")
    bad = next((s for s in SECTIONS if not isinstance(data.get(s, {}), Mapping)), None)
    if bad is not None:
        raise ConfigError(f"a configuration's section '{bad}' is a {type(data[bad]).__name__}, not a table of fields")
    flat = {f"{s}.{k}": v for s in SECTIONS for k, v in data.get(s, {}).items()}
    return override(Config(preset=str(data.get("preset", "vit-seed"))), flat)


__all__ = ["from_dict", "override", "parse_value"]
