"""Quantities written as people read them."""

from __future__ import annotations


def format_bytes(n: float) -> str:
    """Bytes in binary units, one decimal from KiB up: '512 B', '23.4 GiB', '395 EiB'."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB")
    i = 0
    while n >= 1024 and i < len(units) - 1:
        n, i = n / 1024, i + 1
    return f"{n:,.0f} {units[i]}" if i == 0 or n >= 100 else f"{n:.1f} {units[i]}"
