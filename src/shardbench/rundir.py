"""A run's folder: the name it gets when `--out` names none, and whether a run may start or resume in it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax

from shardbench import cluster, models, outdir
from shardbench import config as config_lib
from shardbench.config import Config
from shardbench.errors import ConfigError, FileFault
from shardbench.jsonfile import write_json_atomic
from shardbench.models import custom
from shardbench.models.spec import ModelSpec, shape_tree
from shardbench.parallel.rules import Layout
from shardbench.parsing import from_dict
from shardbench.validation import inert_fields

# Beside config.json, for a model of your own: its file's sha256 and its arrays' shapes when the run started.
MODEL_RECORD = "model.json"
# Beside config.json: what the run's data held when it started (`data.arrays.fingerprint`), for --resume.
DATA_RECORD = "data.json"
# Beside config.json: the layout the run's flags resolved to (--devices 0 and --strategy auto are resolved only
# on the machine), for --resume, which is compared on it rather than on the flags.
LAYOUT_RECORD = "layout.json"
LAYOUT_FIELDS = ("parallel.devices", "parallel.strategy", "parallel.mesh")
# What a resume may give otherwise: where and how the run reports, where its compiled programs are cached (which
# changes no program), and a profile window of the steps it has left (which changes no step).
RESUME_MAY_CHANGE = config_lib.REPORTING_ONLY | {"train.compile_cache", "train.profile", "train.profile_skip",
                                                 "train.profile_steps"}


def resolve_out(cfg: Config) -> Path:
    if cfg.train.out:
        return Path(cfg.train.out)
    if cfg.train.resume:  # a run without --out gets a new folder, runs/<preset>-<strategy>-<time>: none to resume
        raise ConfigError("--resume needs --out: the folder of the run to resume")
    return outdir.stamped(f"{cfg.preset}-{cfg.parallel.strategy.replace('+', '_')}")


def claim_out(cfg: Config) -> outdir.Claim | None:
    """With no --out, process 0 makes the run's folder now, before the checks (`outdir.claim`), so that two runs
    started in the same second get folders of their own; where it cannot, every process stops with its reason.
    None where --out was given, and in the other processes."""
    if cfg.train.out:
        return None
    mine = resolve_out(cfg)
    return cluster.agree("naming the run's folder", lambda: outdir.claim(mine) if jax.process_index() == 0 else None)


def with_out(cfg: Config, claimed: outdir.Claim | None) -> Config:
    """The configuration with --out set to the folder process 0 claimed, in every process."""
    if cfg.train.out:
        return cfg
    out = cluster.exchange(str(claimed.path) if claimed is not None else "")[0]
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, out=out))


def layout_record(layout: Layout) -> dict[str, object]:
    """What a run's layout resolved to: its strategy, its mesh's axes, its devices and processes."""
    return {"strategy": layout.strategy.name, "mesh": {a: n for a, n in layout.shape.items() if n > 1},
            "devices": layout.shape.size, "processes": jax.process_count()}


def _layout_text(record: dict[str, object]) -> str:
    mesh = ",".join(f"{a}={n}" for a, n in dict(record.get("mesh") or {}).items()) or "one device"
    return (f"{record.get('strategy')} on mesh {mesh} ({record.get('devices')} device(s), {record.get('processes')} "
            f"process(es))")


def saved_layout(out: Path) -> dict[str, object] | None:
    """The layout a run started with, from its layout.json; None for a run from before it was kept."""
    path = out / LAYOUT_RECORD
    if not path.is_file():
        return None
    try:
        then = json.loads(path.read_text())
        if not isinstance(then, dict) or not {"strategy", "mesh", "devices", "processes"} <= set(then):
            raise ValueError("not a layout record")
    except (OSError, ValueError) as err:
        raise ConfigError(f"--resume: {path} is unreadable ({err}); start a new run with another --out") from None
    return then


def check_resume(cfg: Config, out: Path, spec: ModelSpec | None = None, layout: Layout | None = None) -> None:
    """A run directory is resumed only with the configuration it was started with, and a model of your own
    (`spec`) only with the file and shapes it was started with. Where the run kept its layout (layout.json) and
    `layout` is this one's, the layouts are compared as resolved, not the flags that chose them: 8 devices
    given as --devices 8 resume a run of --devices 0 on 8, and 4 devices do not."""
    if out.exists() and not out.is_dir():
        raise FileFault(f"--out {out} is a file: give a folder for the run (it holds config.json, checkpoints, ...)")
    saved_path = out / "config.json"
    if cfg.train.resume:
        if not saved_path.exists():
            raise ConfigError(f"--resume: {out} holds no run to resume (no config.json); drop --resume to start one")
        try:
            data = json.loads(saved_path.read_text())
            missing = [s for s in config_lib.SECTIONS if s not in data] if isinstance(data, dict) else []
            if missing:  # `{}` read as the defaults claimed the run "was trained with" them
                raise ConfigError(f"it lacks the section(s) {', '.join(missing)} that every run's config.json holds")
            saved_cfg = from_dict(data)
            saved = config_lib.flatten(saved_cfg)
        except (ValueError, ConfigError) as err:
            raise ConfigError(f"--resume: {saved_path} is unreadable ({err}); start a new run with another "
                              f"--out") from None
        saved, current = as_before_auto_layout(saved, cfg), config_lib.flatten(cfg)
        inert = inert_fields(cfg)  # never read by this configuration, nor by the saved one where all else agrees
        then = saved_layout(out) if layout is not None else None
        if then is not None:
            now = json.loads(json.dumps(layout_record(layout)))
            if then != now:
                raise ConfigError(f"--resume: {out} was trained as {_layout_text(then)}, not {_layout_text(now)}; "
                                  f"resume on the same devices and layout, or start a new run with another --out")
            inert = {*inert, *LAYOUT_FIELDS}  # compared as resolved, just now
        diffs = [k for k in current if k not in RESUME_MAY_CHANGE and k not in inert
                 and saved.get(k) != current[k]]
        unread_then = inert_fields(saved_cfg)  # named last: a run by --steps never read its --epochs
        diffs.sort(key=lambda k: k in unread_then)
        if diffs:
            k = diffs[0]
            more = f" (and {len(diffs) - 1} more)" if len(diffs) > 1 else ""
            raise ConfigError(
                f"--resume: {out} was trained with {k}={saved.get(k)!r}, not {current[k]!r}{more}; resume with "
                f"the same configuration or start a new run with another --out"
            )
        if spec is not None:
            check_same_model(cfg, out, spec)
    elif out.exists() and any(out.iterdir()):
        if (out / "config.json").exists():
            raise ConfigError(f"--out {out} already holds a run: pass --resume to continue it, or choose another "
                              f"--out")
        held = sorted(p.name for p in out.iterdir())
        raise ConfigError(f"--out {out} holds files of something else ({', '.join(held[:3])}"
                          f"{', ...' if len(held) > 3 else ''}), no run: choose an empty or new --out")


def as_before_auto_layout(saved: dict[str, object], cfg: Config) -> dict[str, object]:
    """`saved` (a flattened config.json) as a run under this version would have saved it: --model.qkv-layout's
    default was fused until auto came (2026-11-27, run record schema 8), so a run saved with fused resumes under
    auto where auto runs fused for it here (`models.qkv_layout_ran`): the same projection, parameters and sums."""
    if (saved.get("model.qkv_layout") == "fused" and cfg.model.qkv_layout == "auto"
            and models.qkv_layout_ran(cfg) in (None, "fused")):
        return {**saved, "model.qkv_layout": "auto"}
    return saved


def model_record(cfg: Config, spec: ModelSpec) -> dict[str, object] | None:
    """A model of your own as a resumed run must find it again: its file's sha256 and every array's shape
    (None for a built-in model, which its configuration describes)."""
    if not spec.custom:
        return None
    return {"factory": cfg.model.factory, "file": custom.load(cfg.model.factory).file,
            "sha256": custom.source_digest(cfg.model.factory), "shapes": shape_tree(spec)}


def write_start_records(out: Path, cfg: Config, spec: ModelSpec, layout: Layout, data: str,
                        fingerprint: str) -> None:
    """Write what a new run starts with, which `--resume` finds again: config.json (its configuration),
    layout.json (the layout its flags resolved to), data.json (the dataset `data` and what its splits held,
    `fingerprint`) and, for a model of your own, model.json (its file's sha256 and its arrays' shapes)."""
    records: dict[str, object] = {"config.json": cfg.to_dict(), LAYOUT_RECORD: layout_record(layout),
                                  DATA_RECORD: {"dataset": data, "sha1": fingerprint}}
    if (model := model_record(cfg, spec)) is not None:
        records[MODEL_RECORD] = model
    for name, record in records.items():
        write_json_atomic(out / name, record)


def check_same_model(cfg: Config, out: Path, spec: ModelSpec) -> None:
    """A resumed model of your own has the shapes and the file it was trained with: one line naming the first
    array whose shape changed, else the file that changed. A run from before model.json was kept is not checked."""
    now, path = model_record(cfg, spec), out / MODEL_RECORD
    if now is None or not path.is_file():
        return
    try:
        then = json.loads(path.read_text())
        shapes, digest = dict(then["shapes"]), str(then["sha256"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"--resume: {path} is unreadable ({err}); start a new run with another --out") from None
    file = now["file"] or cfg.model.factory
    advice = "resume with the model it was trained with, or start a new run with another --out"
    ours: dict[str, list[int]] = now["shapes"]  # type: ignore[assignment]
    for name in [*shapes, *(n for n in ours if n not in shapes)]:
        if shapes.get(name) != ours.get(name):
            was = "no such array" if name not in shapes else f"shape {tuple(shapes[name])}"
            is_ = "none" if name not in ours else f"{tuple(ours[name])}"
            raise ConfigError(f"--resume: {out} was trained with {name} of {was}; {file} now makes {is_}: {advice}")
    if digest != now["sha256"]:
        raise ConfigError(f"--resume: {file} changed since {out} was trained with it (sha256 {digest[:12]}..., now "
                          f"{str(now['sha256'])[:12]}...): its shapes are the same, but not its code: {advice}")


def check_same_data(out: Path, name: str, fingerprint: str) -> None:
    """A resumed run reads the data it started on: every split's bytes, as `data.arrays.fingerprint` hashes them
    (`name` only names the data in the refusal). A run from before data.json was kept is not checked."""
    path = out / DATA_RECORD
    if not path.is_file():
        return
    try:
        then = json.loads(path.read_text())
        digest = str(then["sha1"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"--resume: {path} is unreadable ({err}); start a new run with another --out") from None
    if digest != fingerprint:
        raise ConfigError(f"--resume: {out} was trained on other examples than {name} holds now (sha1 "
                          f"{digest[:12]}... then, {fingerprint[:12]}... now): resume with the data it was trained "
                          f"on, or start a new run with another --out")
