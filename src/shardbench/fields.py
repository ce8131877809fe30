"""How a configuration field is declared: its default, help, choices and range in one `setting(...)`, kept in the
dataclass field's metadata, where the flags, `--help`, the validation and the docs' flag table all read it."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
KEY = "shardbench"  # the metadata key a declaration is stored under


@dataclass(frozen=True)
class Range:
    """The values a numeric field takes: low <= value (or low < value), value <= high (or < high)."""

    low: float
    high: float = math.inf
    low_open: bool = False  # the value must be greater than `low`
    high_open: bool = False  # the value must be less than `high`
    note: str = ""  # what a special value means, e.g. "0 = train by --epochs"

    def holds(self, value: float) -> bool:
        """Whether `value` lies inside; an int is compared exactly (however many digits: never through float)."""
        if not isinstance(value, int) and not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def text(self) -> str:
        low = "(" if self.low_open else "["
        high = ")" if self.high_open or math.isinf(self.high) else "]"
        top = "inf" if math.isinf(self.high) else _number(self.high)
        return f"{low}{self.low:g}, {top}{high}" + (f"; {self.note}" if self.note else "")


def _number(value: float) -> str:
    """A bound as a reader types it: 2^31 for a large power of two, else the shortest form."""
    if isinstance(value, int) and value >= 2**16 and value & (value - 1) == 0:
        return f"2^{value.bit_length() - 1}"
    return f"{value:g}"


# Sizes and counts (widths, examples, steps, devices, ...) stay below 2^31: XLA's shapes, jnp's default int32
# and the data pipeline's indices are 32-bit, and a larger value would fail long after the run started.
INT_LIMIT = 2**31


def count(low: int, *, low_open: bool = False, note: str = "") -> Range:
    """The range of an integer size or count: from `low` to below 2^31."""
    return Range(low, INT_LIMIT, low_open=low_open, high_open=True, note=note)


POSITIVE = Range(0, low_open=True)
POSITIVE_COUNT = count(0, low_open=True)
FRACTION = Range(0, 1, high_open=True)


@dataclass(frozen=True)
class Spec:
    """What one field's declaration says besides its type and default."""

    help: str
    choices: tuple[str, ...] = ()  # the values it takes (for a comma list: each item's)
    range: Range | None = None  # for a numeric field
    short: str = ""  # a second, shorter spelling of its flag, e.g. --batch-size for --train.batch-size
    comma_list: bool = False  # a comma list of choices ('' = none)
    repeatable: bool = False  # the flag may be given several times; the values join with commas

    def choices_text(self) -> str:
        """The choices as a reader types them ('' shown as '')."""
        return ", ".join(c or repr(c) for c in self.choices)

    def refusal(self, flag: str, value: Any) -> str | None:
        """One line saying which value is not a choice and what the choices are, or None when every one is."""
        if not self.choices:
            return None
        return unknown_choice(flag, str(value), self.choices, comma_list=self.comma_list)


def unknown_choice(flag: str, value: str, choices: Sequence[str], *, comma_list: bool = False) -> str | None:
    """The one line for a value (each item of a comma list) that is not among `choices`, or None."""
    items = [v.strip() for v in value.split(",") if v.strip()] if comma_list else [value]
    for item in items:
        if item not in choices:
            shown = ", ".join(c or repr(c) for c in choices)
            return (f"unknown {flag} '{item}': choose one of {shown}" + (" (a comma list)" if comma_list else "")
                    + (SWEEP_HINT if not comma_list and a_list_of(item, lambda v: v in choices) else ""))
    return None


SWEEP_HINT = "; several values are a sweep: shardbench sweep takes a comma list and runs each"


def a_list_of(text: str, valid: Callable[[str], bool]) -> bool:
    """Whether `text` is a comma list of two or more values each `valid` alone ('float32,bfloat16')."""
    items = [v.strip() for v in text.split(",")]
    return len(items) > 1 and all(items) and all(valid(v) for v in items)


def list_refusal(flag: str, items: Sequence[str], *, choices: Sequence[str] = (), range: Range | None = None,  # noqa: A002
                 integers: bool = False) -> str | None:
    """The one line for the first item of a comma list (a command that tries several values of one field, or a
    flag of its own) that is not among `choices`, not a whole number where `integers`, or outside `range`; None
    when every item is. The same wording as a single value's refusal."""
    for item in items:
        if choices and item not in choices:
            return unknown_choice(flag, item, choices, comma_list=True)
        if integers and not (item.isascii() and item.isdigit()):
            return f"{flag} '{item}' is not a whole number: give whole numbers, comma separated"
        if range is not None:
            try:
                value: float = int(item) if integers else float(item)
            except ValueError:
                return f"{flag} '{item}' is not a number: give numbers, comma separated"
            if not range.holds(value):
                return f"{flag} must be in {range.text()}, got {item}"
    return None


def setting(default: T, help: str, *, choices: tuple[str, ...] = (), range: Range | None = None,  # noqa: A002
            short: str = "", comma_list: bool = False, repeatable: bool = False) -> T:
    """A dataclass field with its default and its declaration (`Spec`); the field's type is its annotation."""
    spec = Spec(help=help, choices=tuple(choices), range=range, short=short, comma_list=comma_list,
                repeatable=repeatable)
    return dataclasses.field(default=default, metadata={KEY: spec})


def spec_of(f: dataclasses.Field[Any]) -> Spec:
    """The declaration of a field made with `setting`."""
    if KEY not in f.metadata:
        raise TypeError(f"configuration field '{f.name}' is not declared with fields.setting")
    spec: Spec = f.metadata[KEY]
    return spec


__all__ = ["FRACTION", "INT_LIMIT", "POSITIVE", "POSITIVE_COUNT", "Range", "Spec", "count", "list_refusal", "setting",
           "spec_of", "unknown_choice"]
