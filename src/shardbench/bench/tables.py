"""The benchmark record as Markdown tables: medians, ratios between contenders, measured MFU."""

from __future__ import annotations

import statistics
from typing import Any

from shardbench.bench.matmul import label as matmul_label
from shardbench.measure.flops import table_peak

MiB = 2**20


def median_rate(result: dict[str, Any]) -> float | None:
    """Median over the timed windows (images/s, or FLOP/s for the matmul peak); None for a result with an error,
    whose windows (if any) stopped part-way: a rate of 2 of 5 windows is no measurement to compare or divide by."""
    rates = None if "error" in result else result.get("rates")
    return float(statistics.median(rates)) if rates else None


def _first_setting(record: dict[str, Any]) -> str | None:
    return (record.get("settings") or [None])[0]


def _find(record: dict[str, Any], group: str, label: str, setting: str | None = None) -> dict[str, Any]:
    """A case's result; in the step group, of `setting` (default: the first, which the other groups use)."""
    if group == "step":
        setting = setting or _first_setting(record)
    for c in record["cases"]:
        if c["group"] == group and c["label"] == label and (group != "step" or c.get("setting") == setting):
            return c["result"]
    return {}


def peak(record: dict[str, Any], setting: str | None = None) -> float | None:
    return median_rate(_find(record, "step", "matmul peak", setting))


def peak_missing(record: dict[str, Any], setting: str | None = None) -> str:
    """Why there is no measured peak to give MFU against: the matmul peak's failure, or its absence."""
    status = _status(_find(record, "step", "matmul peak", setting))
    return f"the matmul peak {status}" if status else "the step group's matmul peak did not run"


def sheet_peak(result: dict[str, Any], dtype: str, matmul_precision: str = "default") -> float | None:
    """The data-sheet dense peak of the device the contender ran on, where the table knows it."""
    found = table_peak(result.get("device_kind") or "", dtype, matmul_precision)
    return found[0] if found and result.get("platform") != "cpu" else None


def mfu(result: dict[str, Any], peak_flops: float | None) -> float | None:
    rate, flops = median_rate(result), result.get("train_flops_per_image")
    if rate is None or not flops or not peak_flops:
        return None
    return rate * flops / peak_flops


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _status(result: dict[str, Any]) -> str | None:
    if "error" in result:
        error = str(result["error"])
        return error if error.startswith("timed out") else f"failed: {error}"
    if "skipped" in result:
        return f"skipped: {result['skipped']}"
    return None


def setting_matmul(record: dict[str, Any], setting: str | None = None) -> str:
    """What the setting's float32 matmuls computed in on each side, as the workers reported it: "TF32 both",
    "float32 both", or each side's where they differ ("JAX TF32, PyTorch float32")."""
    setting = setting or _first_setting(record)
    dtype = (setting or record["dtype"]).split()[0]
    sides: dict[str, str] = {}
    for c in record["cases"]:
        if c["group"] == "step" and c.get("setting") == setting and c["result"].get("matmul"):
            side = "PyTorch" if c["case"] == "torch" else "JAX"
            sides.setdefault(side, c["result"]["matmul"])
    return matmul_label(dtype, sides)


def setting_title(record: dict[str, Any], setting: str | None) -> str:
    """A setting's name with the matmul arithmetic both sides used, e.g. "float32 b128 (TF32 both)"."""
    how = setting_matmul(record, setting)
    return f"{setting}{f' ({how})' if how else ''}"


def step_table(record: dict[str, Any], setting: str | None = None) -> list[str]:
    setting = setting or _first_setting(record)
    dtype = (setting or record["dtype"]).split()[0]
    precision = record.get("matmul_precision", "default")
    pk = peak(record, setting)
    p = _find(record, "step", "matmul peak", setting)
    lines = [f"Matmul peak ({dtype}, {p.get('size', '?')}^2 through JAX, median of the windows, "
             f"timed in the same rounds as the steps): {_status(p) or _fmt(pk and pk / 1e9, ',.1f', ' GFLOP/s')}"
             + ("" if pk else "; no MFU against the measured peak"), ""]
    contenders = [c for c in record["cases"] if c["group"] == "step" and c["case"] != "matmul-peak"
                  and c.get("setting") == setting]
    if dtype == "float32":  # PyTorch's side is said only where a PyTorch contender ran
        torch = any(c["label"].startswith("pytorch") and not _status(c["result"]) for c in contenders)
        lines += [f"Matmul precision {precision}: float32 matmuls computed in {setting_matmul(record, setting) or '?'} "
                  f"(JAX's precision '{precision}'"
                  + ("; PyTorch given the closest: TF32 allowed for default and high on CUDA, full float32 for "
                     "highest and on the CPU" if torch else "") + ").", ""]
    baselines = [c for c in contenders if c["label"] != "shardbench"]
    header = ("| step | matmul | images/s (median) | min - max | MFU (measured peak) | MFU (data sheet) | "
              + " | ".join(f"x {c['label']}" for c in baselines) + " | first step s (compile incl.) | peak MiB |")
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    for c in contenders:
        r = c["result"]
        status = _status(r)
        if status:
            lines.append(f"| {c['label']} | {r.get('matmul') or '-'} | {status} |" + " |" * (header.count("|") - 4))
            continue
        rate = median_rate(r)
        ratios = []
        for b in baselines:
            other = median_rate(b["result"])
            ratios.append(_fmt(rate / other if rate and other else None, ".2f", "x"))
        first = r.get("first_step_s", r.get("compile_s"))
        lines.append(f"| {c['label']} | {r.get('matmul') or '-'} | {_fmt(rate, ',.1f')} | "
                     f"{_fmt(min(r['rates']), ',.1f')} - "
                     f"{_fmt(max(r['rates']), ',.1f')} | {_fmt(_pct(mfu(r, pk)), '.1f', '%')} | "
                     f"{_fmt(_pct(mfu(r, sheet_peak(r, dtype, precision))), '.1f', '%')} | "
                     + " | ".join(ratios) + f" | {_fmt(first, '.1f')} | "
                     f"{_fmt(r.get('peak_bytes') and r['peak_bytes'] / MiB, ',.0f')} |")
    lines += headline(record, setting, baselines, pk)
    lines += ["", "Peak MiB: the device allocator's peak (JAX's memory_stats, torch.cuda.max_memory_allocated); "
                  "'-' where the backend keeps none (the CPU)."]
    return lines


def headline(record: dict[str, Any], setting: str | None, baselines: list[dict[str, Any]],
             pk: float | None) -> list[str]:
    """"shardbench / best baseline" over the baselines that measured (a failed one is named, not counted), and
    shardbench's MFU against the measured peak, or why it is not given. Nothing where shardbench has no rate."""
    ours = median_rate(_find(record, "step", "shardbench", setting))
    best = max((median_rate(b["result"]) or 0.0 for b in baselines), default=0.0)
    if not ours or not best:
        return []
    failed = [b["label"] for b in baselines if median_rate(b["result"]) is None]
    among = f" (of those that measured; not {', '.join(failed)})" if failed else ""
    ours_mfu = mfu(_find(record, "step", "shardbench", setting), pk)
    against = (_fmt(_pct(ours_mfu), '.1f', '%') if pk else f"not given ({peak_missing(record, setting)})")
    return ["", f"shardbench / best baseline{among}: {ours / best:.2f}x; shardbench MFU against the measured peak: "
                f"{against}"]


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
    for _, label, r in found:
        status = _status(r)
        batch = label.split()[-1]
        if status:
            lines.append(f"| {batch} | {status} | | |")
            continue
        lines.append(f"| {batch} | {_fmt(median_rate(r), ',.1f')} | {_fmt(_pct(mfu(r, pk)), '.1f', '%')} | "
                     f"{_fmt(r.get('temp_bytes') and r['temp_bytes'] / MiB, ',.0f')} |")
    if pk is None:  # under the table: a note in its header line would be a fifth column and no table at all
        lines += ["", f"No MFU: {peak_missing(record)}."]
    return lines


def layers_table(record: dict[str, Any]) -> list[str]:
    depth: dict[int, dict[str, dict[str, Any]]] = {}
    for c in record["cases"]:
        if c["group"] == "layers":
            n, _, how = c["label"].split(" ")  # "12 layers scan", "1 layer unrolled"
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
    failed = [f"{name}: {_status(r)}" for name, r in (("tuned allocator", tuned), ("default allocator", default))
              if _status(r)]
    if failed:  # one side alone is no comparison
        return failed
    a, b = median_rate(tuned), median_rate(default)
    ca, cb = tuned.get("compile_s"), default.get("compile_s")
    ra, rb = tuned.get("rates") or [], default.get("rates") or []
    spread = (f" (windows {min(ra):,.1f} - {max(ra):,.1f} and {min(rb):,.1f} - {max(rb):,.1f})" if ra and rb else "")
    lines = [f"shardbench step with the tuned glibc allocator: {_fmt(a, ',.1f')} images/s; with glibc's default: "
             f"{_fmt(b, ',.1f')} images/s ({_fmt(a / b if a and b else None, '.2f', 'x')}), timed in "
             f"alternation{spread}",
             f"compile (lower + compile, cache off): {_fmt(ca, '.1f', ' s')} tuned, {_fmt(cb, '.1f', ' s')} default "
             f"({_fmt(ca / cb if ca and cb else None, '.2f', 'x')})"]
    if ra and rb and max(min(ra), min(rb)) <= min(max(ra), max(rb)):  # one window of each could be the other's
        lines.append("The two sides' windows overlap: this run measured no difference between the allocators' "
                     "steps; rerun with more --windows on an idle machine to tell them apart.")
    return lines


SECTIONS = (
    ("step", "Train step, one device", step_table),
    ("batch", "Throughput per device vs batch size", batch_table),
    ("layers", "Compile time vs depth", layers_table),
    ("remat", "Activation checkpointing", remat_table),
    ("pipeline", "Input pipeline", pipeline_lines),
    ("alloc", "Allocator", alloc_lines),
)


# A last-minute load average from this high, before any contender started, means other processes shared the cores.
BUSY_LOAD = 0.5


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def busy_host(machine: dict[str, Any]) -> str:
    """Why the figures are not to be trusted where other processes were using the CPU when the bench started, or
    '': a shared CPU slows every contender, but not alike (PyTorch's OpenMP threads, which spin while waiting,
    far more than XLA's), so even the ratios move."""
    load = machine.get("load_average")
    if load is None or load < BUSY_LOAD:
        return ""
    return (f"the host's load average was {load:g} over {machine.get('cpu_count') or '?'} cores when the bench "
            f"started: other processes were using the CPU, which slows the contenders unevenly (PyTorch's threads "
            f"most), so the ratios as well as the rates may be off; rerun on an idle machine")


def render(record: dict[str, Any]) -> str:
    m = record["machine"]
    t = record["timing"]
    settings = record.get("settings") or [f"{record['dtype']} b{record['batch_size']}"]
    present = {c["group"] for c in record["cases"]}
    # The step group runs the settings; without it the title names the groups that ran (or, where none finished,
    # those asked for), not a setting none ran.
    named = present or set(record.get("groups") or ["step"])
    step = "step" in named
    titles = [setting_title(record, s) for s in settings] if step else \
        [f"{record['dtype']}, " + ", ".join(group for group, _, _ in SECTIONS if group in named)]
    others = f"at most 3 timed windows after {_count(min(t['warmup'], 1), 'warm-up step')}"
    throughput = (f"median of {t['windows']} timed windows after {_count(t['warmup'], 'warm-up step')} (other "
                  f"groups: {others})" if step else f"median of {others}")
    busy = busy_host(m)
    lines = [f"# shardbench bench: {record['preset']}, {' and '.join(titles)}", "",
             f"Machine: {m.get('cpu', '?')}, {m.get('cpu_count')} cores, {m.get('system')}; jax {m.get('jax')}; "
             f"allocator: {m.get('allocator') or 'default'}"
             + (f"; load average {m['load_average']:g} at the start" if "load_average" in m else "") + ".",
             *([f"**Warning:** {busy}"] if busy else []),
             f"Throughput: {throughput}; each case in its own process; within a group the contenders' windows "
             f"alternate, round by round.", ""]
    if not record.get("finished", True):  # records from before the mark say nothing either way
        ran = {c["group"] for c in record.get("cases", [])}
        missing = [g for g in record.get("groups") or [] if g not in ran]
        why = f"stopped by {record['stopped']}" if record.get("stopped") else "still running, or stopped"
        lines[-1:-1] = [f"**Not finished ({why}):** the group(s) {', '.join(missing) or '–'} did not run to their "
                        f"end; the tables hold the groups that did."]
    for note in record.get("trimmed") or []:
        lines.insert(-1, f"Trimmed on an accelerator: {note}.")
    for group, title, fn in SECTIONS:
        if group == "step" and group in present:
            for setting in record.get("settings") or [None]:
                lines += [f"## {title}{f', {setting_title(record, setting)}' if setting else ''}", "",
                          *step_table(record, setting), ""]
        elif group in present:
            lines += [f"## {title}", "", *fn(record), ""]
    return "\n".join(lines).rstrip()
