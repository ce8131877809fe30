"""The parameter table (the seed's model summary, plus layout) and a text picture of one array over the mesh."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
from jax.sharding import PartitionSpec

from shardbench.parallel.rules import Layout, flat_by_path


@dataclass(frozen=True)
class ParamRow:
    path: str
    axes: tuple[str | None, ...]
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    spec: PartitionSpec
    device_shape: tuple[int, ...]
    device_bytes: int


def param_table(axes_tree: dict[str, Any], shapes: dict[str, Any], dtype: Any, layout: Layout) -> list[ParamRow]:
    """One row per parameter, in path order, with its layout under `layout`."""
    flat_axes, flat_shapes = flat_by_path(axes_tree), flat_by_path(shapes)
    itemsize = jax.numpy.dtype(dtype).itemsize
    rows = []
    for path in sorted(flat_axes):
        axes, shape = flat_axes[path], tuple(flat_shapes[path])
        spec = layout.param_spec(axes, shape)
        device_shape = tuple(layout.sharding(spec).shard_shape(shape))
        rows.append(ParamRow(path, axes, shape, jax.numpy.dtype(dtype).name, math.prod(shape) * itemsize, spec,
                             device_shape, math.prod(device_shape) * itemsize))
    return rows


def _spec_text(spec: PartitionSpec, ndim: int) -> str:
    parts = list(spec) + [None] * (ndim - len(spec))
    return "P(" + ", ".join("None" if p is None else repr(p) for p in parts) + ")"


def format_table(rows: list[ParamRow]) -> str:
    """Fixed-width text table with totals."""
    head = ("path", "logical axes", "shape", "dtype", "bytes", "PartitionSpec", "per device", "bytes/device")
    body = [(r.path, "(" + ", ".join(str(a) for a in r.axes) + ")", str(r.shape), r.dtype, f"{r.bytes:,}",
             _spec_text(r.spec, len(r.shape)), str(r.device_shape), f"{r.device_bytes:,}") for r in rows]
    count = sum(math.prod(r.shape) for r in rows)
    total = ("total", "", f"{count:,} params", "", f"{sum(r.bytes for r in rows):,}", "", "",
             f"{sum(r.device_bytes for r in rows):,}")
    widths = [max(len(row[i]) for row in [head, *body, total]) for i in range(len(head))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if i < 2 or i in (3, 5) else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(head), rule, *(line(b) for b in body), rule, line(total)])


def format_placements(axes_tree: dict[str, Any], shapes: dict[str, Any], layout: Layout) -> str:
    """Per parameter, where its optimizer state and its gradient live and what one device holds of each: for a
    strategy that places them apart from the parameter (ZeRO-1 and ZeRO-2)."""
    flat_axes, flat_shapes = flat_by_path(axes_tree), flat_by_path(shapes)
    head = ("path", "optimizer state", "per device", "gradient", "per device")
    body = []
    for path in sorted(flat_axes):
        axes, shape = flat_axes[path], tuple(flat_shapes[path])
        opt, grad = layout.optimizer_spec(axes, shape), layout.gradient_spec(axes, shape)
        body.append((path, _spec_text(opt, len(shape)), str(tuple(layout.sharding(opt).shard_shape(shape))),
                     _spec_text(grad, len(shape)), str(tuple(layout.sharding(grad).shard_shape(shape)))))
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _span(s: slice, size: int) -> tuple[int, int]:
    start, stop, _ = s.indices(size)
    return start, stop


def picture(name: str, shape: tuple[int, ...], sharding: jax.sharding.Sharding) -> str:
    """Which devices hold which block of `name`, drawn over the two dims that matter most."""
    if not shape:
        return f"{name}: a scalar, replicated on every device"
    index_map = sharding.devices_indices_map(shape)
    sharded = [d for d in range(len(shape))
               if len({_span(idx[d], shape[d]) for idx in index_map.values()}) > 1]
    dims = (sharded + [d for d in range(len(shape) - 1, -1, -1) if d not in sharded])[:2]
    dims = sorted(dims)
    row_dim, col_dim = (dims[0], dims[1]) if len(dims) == 2 else (dims[0], None)
    cells: dict[tuple[tuple[int, int], tuple[int, int]], list[int]] = {}
    for device, idx in index_map.items():
        r = _span(idx[row_dim], shape[row_dim])
        c = _span(idx[col_dim], shape[col_dim]) if col_dim is not None else (0, 1)
        cells.setdefault((r, c), []).append(device.id)
    rows = sorted({k[0] for k in cells})
    cols = sorted({k[1] for k in cells})
    label = {(r, c): "dev " + ",".join(str(d) for d in sorted(ids)) for (r, c), ids in cells.items()}
    width = max(len(v) for v in label.values()) + 2
    col_head = [f"{c[0]}:{c[1]}" if col_dim is not None else "" for c in cols]
    width = max(width, *(len(h) + 2 for h in col_head))
    row_head = [f"{r[0]}:{r[1]}" for r in rows]
    rw = max(len(h) for h in row_head)
    shown = f"dims {row_dim} x {col_dim}" if col_dim is not None else f"dim {row_dim}"
    out = [f"{name}  shape {shape}  sharding {getattr(sharding, 'spec', 'single device')}  (showing {shown})"]
    border = " " * (rw + 1) + "+" + "+".join("-" * width for _ in cols) + "+"
    out.append(" " * (rw + 2) + " ".join(h.center(width) for h in col_head))
    out.append(border)
    for r, rh in zip(rows, row_head):
        out.append(rh.rjust(rw) + " |" + "|".join(label.get((r, c), "").center(width) for c in cols) + "|")
        out.append(border)
    other = [d for d in range(len(shape)) if d not in dims and d in sharded]
    if other:
        out.append(f"(dims {other} are split too; cells list every device holding that block)")
    return "\n".join(out)
