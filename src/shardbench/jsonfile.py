"""JSON files that are either whole or absent: written through a temporary file and an atomic rename (so a
reader, or a later run, never sees half a file), and read back as a dict or nothing."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def finite(value: Any) -> Any:
    """`value` with every non-finite float inside it (an untimed link's infinite bandwidth) as None, which strict
    JSON readers take; Python's json would write Infinity, which they refuse."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def write_json_atomic(path: Path, data: Any) -> None:
    """`data` as JSON at `path`, replacing it in one rename; the temporary name is this process's own."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


def read_json_dict(path: Path) -> dict[str, Any]:
    """The JSON object at `path`, or {} where there is none (or it is not an object)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
