"""The benchmark record as Markdown tables: medians, ratios between contenders, measured MFU."""

from __future__ import annotations

import statistics
from typing import Any

MiB = 2**20


def median_rate(result: dict[str, Any]) -> float | None:
    """Median over the timed windows (images/s, or FLOP/s for the matmul peak)."""
    rates = result.get("rates")
    return float(statistics.median(rates)) if rates else None


def _find(record: dict[str, Any], group: str, label: str) -> dict[str, Any]:
    for c in record["cases"]:
        if c["group"] == group and c["label"] == label:
            return c["result"]
    return {}


def peak(record: dict[str, Any]) -> float | None:
    return median_rate(_find(record, "step", "matmul peak"))


def mfu(result: dict[str, Any], peak_flops: float | None) -> float | None:
    rate, flops = median_rate(result), result.get("train_flops_per_image")
    if rate is None or not flops or not peak_flops:
        return None
    return rate * flops / peak_flops


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _status(result: dict[str, Any]) -> str | None:
    if "error" in result:
        return f"failed: {result['error']}"
    if "skipped" in result:
        return f"skipped: {result['skipped']}"
    return None


def step_table(record: dict[str, Any]) -> list[str]:
    pk = peak(record)
    p = _find(record, "step", "matmul peak")
    lines = [f"Matmul peak ({record['dtype']}, {p.get('size', '?')}^2 through JAX, median of the windows, "
             f"timed in the same rounds as the steps): {_fmt(pk and pk / 1e9, ',.1f', ' GFLOP/s')}", ""]
    contenders = [c for c in record["cases"] if c["group"] == "step" and c["case"] != "matmul-peak"]
    baselines = [c for c in contenders if c["label"] != "shardbench"]
    header = "| step | images/s (median) | min - max | MFU | " + " | ".join(
        f"x {c['label']}" for c in baselines) + " | first step s |"
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    for c in contenders:
        r = c["result"]
        status = _status(r)
        if status:
            lines.append(f"| {c['label']} | {status} |" + " |" * (header.count("|") - 3))
            continue
        rate = median_rate(r)
        ratios = []
        for b in baselines:
            other = median_rate(b["result"])
            ratios.append(_fmt(rate / other if rate and other else None, ".2f", "x"))
        first = r.get("first_step_s", r.get("compile_s"))
        lines.append(f"| {c['label']} | {_fmt(rate, ',.1f')} | {_fmt(min(r['rates']), ',.1f')} - "
                     f"{_fmt(max(r['rates']), ',.1f')} | {_fmt(_pct(mfu(r, pk)), '.1f', '%')} | "
                     + " | ".join(ratios) + f" | {_fmt(first, '.1f')} |")
    best = max((median_rate(b["result"]) or 0.0 for b in baselines), default=0.0)
    ours = median_rate(_find(record, "step", "shardbench"))
    if best and ours:
        lines += ["", f"shardbench / best baseline: {ours / best:.2f}x; shardbench MFU against the measured peak: "
                      f"{_fmt(_pct(mfu(_find(record, 'step', 'shardbench'), pk)), '.1f', '%')}"]
    return lines


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def batch_table(record: dict[str, Any]) -> list[str]:
    pk = peak(record)
    found = [("batch", c["label"], c["result"]) for c in record["cases"] if c["group"] == "batch"]
    step = _find(record, "step", "shardbench")
    if step:
        found.append(("step", f"batch {record['batch_size']}", step))
    found.sort(key=lambda x: int(x[1].split()[-1]))
    lines = ["| batch | images/s per device | MFU | compiled temporaries MiB |", "|---:|---:|---:|---:|"]
    if pk is None:
        lines[0] += "  (MFU needs the step group's matmul peak)"
    for _, label, r in found:
        status = _status(r)
        batch = label.split()[-1]
        if status:
            lines.append(f"| {batch} | {status} | | |")
            continue
        lines.append(f"| {batch} | {_fmt(median_rate(r), ',.1f')} | {_fmt(_pct(mfu(r, pk)), '.1f', '%')} | "
                     f"{_fmt(r.get('temp_bytes') and r['temp_bytes'] / MiB, ',.0f')} |")
    return lines


def layers_table(record: dict[str, Any]) -> list[str]:
    depth: dict[int, dict[str, dict[str, Any]]] = {}
    for c in record["cases"]:
        if c["group"] == "layers":
            n, how = c["label"].split(" layers ")
            depth.setdefault(int(n), {})[how] = c["result"]
    lines = ["| layers | compile s, rolled scan | compile s, unrolled | temporaries MiB rolled / unrolled |",
             "|---:|---:|---:|---:|"]
    for n in sorted(depth):
        scan, unrolled = depth[n].get("scan", {}), depth[n].get("unrolled", {})
        cells = []
        for r in (scan, unrolled):
            cells.append(_status(r) or _fmt(r.get("compile_s"), ".1f"))
        mem = " / ".join(_fmt(r.get("temp_bytes") and r["temp_bytes"] / MiB, ",.0f") for r in (scan, unrolled))
        lines.append(f"| {n} | {cells[0]} | {cells[1]} | {mem} |")
    return lines


def remat_table(record: dict[str, Any]) -> list[str]:
    base = _find(record, "remat", "remat none")
    lines = ["| --remat | compiled temporaries MiB | memory vs none | images/s | time per step vs none |",
             "|---|---:|---:|---:|---:|"]
    for label, r in [(c["label"], c["result"]) for c in record["cases"] if c["group"] == "remat"]:
        status = _status(r)
        name = label.split()[-1]
        if status or not r:
            lines.append(f"| {name} | {status or 'not run'} | | | |")
            continue
        mem, rate = r.get("temp_bytes"), median_rate(r)
        base_mem, base_rate = base.get("temp_bytes"), median_rate(base)
        lines.append(f"| {name} | {_fmt(mem and mem / MiB, ',.0f')} | "
                     f"{_fmt(mem / base_mem if mem and base_mem else None, '.2f', 'x')} | {_fmt(rate, ',.1f')} | "
                     f"{_fmt(base_rate / rate if rate and base_rate else None, '.2f', 'x')} |")
    return lines


def pipeline_lines(record: dict[str, Any]) -> list[str]:
    r = _find(record, "pipeline", "host pipeline")
    status = _status(r)
    if status:
        return [f"host pipeline: {status}"]
    return [f"Host input pipeline (shuffle, batch gather, prefetch, hand-over to the device; "
            f"{r.get('cores')} core(s), batch {r.get('batch_size')}): **{_fmt(r.get('images_per_s'), ',.0f')} "
            f"images/s**",
            f"On-device augmentation (random resized crop + flip + normalise, jitted, same core(s)): "
            f"{_fmt(r.get('augment_images_per_s'), ',.0f')} images/s"]


def alloc_lines(record: dict[str, Any]) -> list[str]:
    tuned, default = _find(record, "alloc", "tuned allocator"), _find(record, "alloc", "glibc default allocator")
    status = _status(default)
    if status:
        return [f"default allocator: {status}"]
    a, b = median_rate(tuned), median_rate(default)
    return [f"shardbench step with the tuned glibc allocator: {_fmt(a, ',.1f')} images/s; with glibc's default: "
            f"{_fmt(b, ',.1f')} images/s ({_fmt(a / b if a and b else None, '.2f', 'x')}), timed in alternation"]


SECTIONS = (
    ("step", "Train step, one device", step_table),
    ("batch", "Throughput per device vs batch size", batch_table),
    ("layers", "Compile time vs depth", layers_table),
    ("remat", "Activation checkpointing", remat_table),
    ("pipeline", "Input pipeline", pipeline_lines),
    ("alloc", "Allocator", alloc_lines),
)


def render(record: dict[str, Any]) -> str:
    m = record["machine"]
    t = record["timing"]
    lines = [f"# shardbench bench: {record['preset']}, batch {record['batch_size']}, {record['dtype']}", "",
             f"Machine: {m.get('cpu', '?')}, {m.get('cpu_count')} cores, {m.get('system')}; jax {m.get('jax')}; "
             f"allocator: {m.get('allocator') or 'default'}.",
             f"Throughput: median of {t['windows']} timed windows after {t['warmup']} warm-up steps (other groups: "
             f"at most 3 windows after 1 warm-up step); each case in its own process; within a group the "
             f"contenders' windows alternate, round by round.", ""]
    present = {c["group"] for c in record["cases"]}
    for group, title, fn in SECTIONS:
        if group in present:
            lines += [f"## {title}", "", *fn(record), ""]
    return "\n".join(lines).rstrip()
