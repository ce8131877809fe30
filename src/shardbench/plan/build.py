"""A plan: every candidate compiled, predicted on the target and ranked, with a recommendation; printed as a
table and written as plan.json and plan.md."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from shardbench import config as config_lib
from shardbench import models
from shardbench.units import format_bytes
from shardbench.errors import ConfigError
from shardbench.jsonfile import finite, write_json_atomic
from shardbench.plan.calibration import Coefficients, to_dict
from shardbench.plan.candidates import Candidate, candidate_config, folded_line
from shardbench.plan.predict import Hardware, predict
from shardbench.plan.recommend import MIB, Row, ms, rank, recommendation
from shardbench.plan.steptime import FORMULA
from shardbench.plan.target import Target


def untimed_links(hardware: dict[str, Hardware]) -> tuple[str, ...]:
    """The links whose transfers the prediction does not time: no bandwidth on the chip's data sheet (a TPU v4's
    ICI, say), which `machine` sets as infinite."""
    return tuple(link for link in ("intra", "inter")
                 if any(h.bandwidth.get(link) == float("inf") for h in hardware.values()))


def unmodelled_attention(cfg: config_lib.Config, platform: str) -> list[str]:
    """Where `--model.attention auto` (or cudnn) would run cuDNN's attention on the GPU target: the planner
    compiles the candidates elsewhere, with another attention, and its GPU defaults were fitted to runs of XLA's
    attention and the fused q/k/v projection (benchmarks/data/h100-2026-11-24), so it says what it leaves out."""
    if platform != "gpu" or cfg.model.attention not in ("auto", "cudnn") or models.auto_cudnn_config_problem(cfg):
        return []
    return [f"attention: cuDNN's, which --model.attention {cfg.model.attention} runs for the {cfg.model.kind} on an "
            f"NVIDIA GPU, is not modelled (the GPU defaults were fitted to XLA's attention): on one H100 it ran "
            f"lm-seed's step at sequence 1024 in 0.30x the time and a sixth of the memory, and vit-seed's bfloat16 "
            f"b1024 step, with the seq-major q/k/v projection auto picks beside it, in about 0.83x (2026-11-27): "
            f"expect such steps to be predicted long, and the LM's memory high"]


class AllRefused(ConfigError):
    """Every candidate was refused before compiling. The message names the first refusal (what `shardbench plan`
    prints); `refusals` holds each candidate's own reason, by candidate name."""

    def __init__(self, message: str, refusals: dict[str, str]) -> None:
        super().__init__(message)
        self.refusals = refusals


@dataclass(frozen=True)
class Plan:
    cfg: config_lib.Config
    target: Target
    hardware: dict[str, Hardware]  # per dtype
    coefficients: Coefficients
    activation_source: str
    compilers: str  # the compilers that compiled the candidates
    rows: list[Row]  # ranked
    compile_s: float  # wall time of all the compilation
    line: str
    folded: dict[str, str] = field(default_factory=dict)  # strategy left out -> the one it lays out as (one device)

    def header(self) -> list[str]:
        c = self.cfg
        model = c.model.factory or c.preset
        hw = next(iter(self.hardware.values()))
        return [f"plan for {model} at global batch {c.train.batch_size} on {self.target.spec}: {hw.name}",
                f"{self.counted()} for {self.target.devices} device(s) in {self.compile_s:.0f} s; nothing was run",
                *([folded_line(self.folded)] if self.folded else [])]

    def counted(self) -> str:
        """'21 candidate(s): 1 compiled, 20 refused before compiling' (it said '21 candidate(s) compiled')."""
        compiled = sum(r.prediction is not None for r in self.rows)
        refused = sum(r.prediction is None and r.problem.startswith("refused") for r in self.rows)
        failed = len(self.rows) - compiled - refused
        parts = [f"{compiled} compiled", *([f"{refused} refused before compiling"] if refused else []),
                 *([f"{failed} failed to compile"] if failed else [])]
        return f"{len(self.rows)} candidate(s): {', '.join(parts)}"

    def assumptions(self) -> list[str]:
        hw = next(iter(self.hardware.values()))
        k = self.coefficients
        peaks = "; ".join(f"{d}: {h.peak_source}" for d, h in self.hardware.items())
        lines = [
            f"compiled by: {self.compilers}",
            "state (params, optimizer, gradients) and collectives: exact, from the compiled step",
            f"activations: {self.activation_source}",
            f"memory: {hw.memory_source}",
            f"step time: {FORMULA}",
            f"compute: matmul FLOPs at the peak ({peaks}); traffic: XLA's count of the bytes the step reads and "
            f"writes at {hw.memory_bandwidth_source}",
            f"links: {hw.bandwidth_source}",
            f"coefficients: {k.describe()}",
        ]
        lines += unmodelled_attention(self.cfg, hw.platform)
        if hw.platform == "gpu" and self.target.devices > 1:
            lines.append("communication: data sheet (link bandwidths, ring algorithms) and an assumed per-collective "
                         "cost; no multi-GPU run has checked it (the GPU calibration is one H100)")
        return lines

    def table(self) -> list[list[str]]:
        first = next(iter(self.hardware.values()))
        names = {link: first.link_name(link) for link in ("intra", "inter")}
        two_links = names["inter"] != names["intra"]  # a CPU's simulated devices have one: memory copies
        head = ["#", "candidate", "memory/device", "fits", "params+opt+grads", "activations",
                f"{names['intra']} MiB", *([f"{names['inter']} MiB"] if two_links else []),
                "compute ms", "bound", "comms ms", "step ms", "examples/s", "MFU"]
        # Pipelines: the bubble by the schedule's formula (in the step time) and the stage-to-stage bytes per
        # link they cross, shown where some candidate has stages.
        staged = any(r.prediction is not None and r.candidate.microbatches for r in self.rows)
        head += ["bubble", "stage-to-stage MiB"] if staged else []
        rows = [head]
        for i, r in enumerate(self.rows, 1):
            p = r.prediction
            if p is None:  # a short row: number, name, why
                rows.append([str(i), r.candidate.name, r.problem])
                continue
            state = p.params_bytes + p.optimizer_bytes + p.gradients_bytes
            rows.append([
                # Binary units to three figures: a small model's megabytes read "0.00 GB" alike for every candidate.
                str(i), r.candidate.name, format_bytes(p.total_bytes),
                f"yes ({p.headroom:.0%} free)" if p.fits else f"no ({p.total_bytes / p.memory_bytes:.1f}x)",
                format_bytes(state), format_bytes(p.activations_bytes),
                f"{p.comm_bytes.get('intra', 0) / MIB:.1f}",
                *([f"{p.comm_bytes.get('inter', 0) / MIB:.1f}"] if two_links else []),
                ms(p.compute_s), p.bound, ms(p.exposed_comm_s), ms(p.step_s),
                f"{p.examples_per_s:,.0f}", f"{p.mfu:.1%}",
                *([f"{p.bubble:.1%}" if r.candidate.microbatches else "-",
                   ", ".join(f"{v / MIB:.2f} {names[k]}" for k, v in sorted(p.stage_bytes.items())) or "-"]
                  if staged else [])])
        return rows

    def text(self) -> str:
        rows = self.table()
        shown = [r for r in rows if len(r) == len(rows[0])]
        widths = [max(len(r[i]) for r in shown) for i in range(len(rows[0]))]
        lines = [*self.header(), ""]
        lines += [("  ".join(cell.ljust(w) for cell, w in zip(r, widths)) if len(r) == len(widths) else
                   f"{r[0].ljust(widths[0])}  {r[1]}: {r[-1]}").rstrip() for r in rows]
        lines += ["", "assumptions:", *(f"  {a}" for a in self.assumptions()), "", self.line]
        return "\n".join(lines)

    def markdown(self) -> str:
        rows = self.table()
        title, *said = self.header()
        lines = [f"# {title}", "", *(part for line in said for part in (line, "")), f"**{self.line}**", ""]
        lines += ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        for r in rows[1:]:
            cells = r if len(r) == len(rows[0]) else [*r, *[""] * (len(rows[0]) - len(r))]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines += ["", "Assumptions and sources:", "", *(f"- {a}" for a in self.assumptions()), ""]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return {
            "target": self.target.spec, "devices": self.target.devices, "config": config_lib.flatten(self.cfg),
            # a link or memory bandwidth the data sheet lacks is infinite (not timed): null in the file
            "hardware": {d: finite(h.__dict__) for d, h in self.hardware.items()},
            "coefficients": to_dict(self.coefficients), "recommendation": self.line, "compilers": self.compilers,
            "sources": self.assumptions(),
            "compile_s": self.compile_s, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "folded": self.folded, "folded_line": folded_line(self.folded),
            "candidates": [{"name": r.candidate.name, "strategy": r.candidate.strategy, "mesh": r.candidate.mesh,
                            "remat": r.candidate.remat, "dtype": r.candidate.dtype,
                            "grad_accum": r.candidate.grad_accum, "microbatches": r.candidate.microbatches,
                            "schedule": r.candidate.schedule,
                            "prediction": r.prediction.to_dict() if r.prediction else None,
                            "problem": r.problem or None} for r in self.rows],
        }

    def write(self, out: Path) -> tuple[Path, Path]:
        out.mkdir(parents=True, exist_ok=True)
        md = out / "plan.md"
        write_json_atomic(out / "plan.json", self.to_dict())
        tmp = md.with_suffix(".md.tmp")
        tmp.write_text(self.markdown())
        tmp.replace(md)
        return out / "plan.json", md


def make_plan(cfg: config_lib.Config, target: Target, cands: list[Candidate], workers: int,
              calibrate: list[Path], progress: TextIO | None = sys.stderr,
              folded: dict[str, str] | None = None) -> Plan:
    """Compile every candidate (refusing those `shardbench train` would refuse), predict and rank them; `folded`:
    the strategies left out of `cands` for laying out as another (`one_per_layout`), which the plan names.
    Raises AllRefused (a ConfigError) when every candidate is refused: nothing was compiled."""
    from shardbench.plan.machine import hardware
    from shardbench.plan.measured import calibrate as fit_runs
    from shardbench.plan.workers import compile_all, default_workers
    from shardbench.config import cache_root

    platform = "cpu" if target.chip is None else ("tpu" if target.topology else "gpu")
    calibration = fit_runs(calibrate, workers, progress)
    coefficients = calibration.coefficients[platform]
    span = target.devices if target.topology else target.per_node
    topology = ({"chip": target.chip.name, "shape": list(target.topology)} if target.topology and target.chip
                else None)
    gpu_kind = target.chip.name if platform == "gpu" and target.chip else None
    jobs = [{"name": c.name, "config": candidate_config(cfg, c, target.devices), "link_span": span,
             "topology": topology, "gpu_kind": gpu_kind} for c in cands]
    done = [0]

    def show(line: dict[str, object]) -> None:
        done[0] += 1
        if progress is not None:
            what = ("compiled" if "result" in line else "refused" if "refused" in line else "failed")
            print(f"plan: {done[0]}/{len(jobs)} {what}: {line['name']}", file=progress, flush=True)

    start = time.perf_counter()
    found = compile_all(jobs, workers or default_workers(), show)
    elapsed = time.perf_counter() - start
    lines = [found[c.name] for c in cands]
    if all("refused" in line for line in lines):
        raise AllRefused(f"no candidate can run on {target.devices} device(s): {lines[0]['refused']}",
                         {c.name: str(line["refused"]) for c, line in zip(cands, lines)})
    hw = {d: hardware(target, d, cfg.precision.matmul_precision, cache_root(cfg))
          for d in dict.fromkeys(c.dtype for c in cands)}
    sources: set[str] = set()
    compilers: set[str] = set()
    rows: list[Row] = []
    for c, line in zip(cands, lines):
        if "result" not in line:
            kind = "refused" if "refused" in line else "failed to compile"
            rows.append(Row(c, None, f"{kind}: {line.get('refused') or line.get('error')}"))
            continue
        compiled_for = line["result"]["platform"]
        scale, source = calibration.activation_scale(compiled_for, platform, c.dtype)
        sources.add(source)
        p = predict(line["result"], hw[c.dtype], coefficients, batch=cfg.train.batch_size, remat=c.remat,
                    dtype=c.dtype, activation_scale=scale, activation_source=source,
                    runtime_bytes=calibration.runtime(compiled_for, platform))
        compilers.add(p.compiler)
        rows.append(Row(c, p))
    ranked = rank(rows)
    return Plan(cfg, target, hw, coefficients, "; ".join(sorted(sources)), ", ".join(sorted(compilers)) or "none",
                ranked, elapsed, recommendation(ranked, next(iter(hw.values())), untimed_links(hw)), dict(folded or {}))
