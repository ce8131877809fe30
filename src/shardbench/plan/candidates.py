"""The layouts a plan considers: every strategy on every mesh factorisation of the target's devices that the
strategy can use, at the given global batch, for each remat policy and dtype asked for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardbench import config as config_lib
from shardbench.errors import ConfigError


@dataclass(frozen=True)
class Candidate:
    strategy: str
    mesh: str  # 'none' or 'DATAxMODEL'
    remat: str
    dtype: str

    @property
    def name(self) -> str:
        return f"{self.strategy} {self.mesh} remat={self.remat} {self.dtype}"


# Which mesh axes a strategy may give more than one device (`shardbench.parallel.rules.STRATEGIES`).
USES = {"single": (), "dp": ("data",), "fsdp": ("data",), "tp": ("model",), "dp+tp": ("data", "model"),
        "fsdp+tp": ("data", "model")}


def factorisations(devices: int) -> list[tuple[int, int]]:
    """(data, model) with data x model = devices."""
    return [(d, devices // d) for d in range(1, devices + 1) if devices % d == 0]


def candidates(devices: int, batch: int, strategies: list[str], remats: list[str],
               dtypes: list[str]) -> list[Candidate]:
    """Every candidate; a one-line ConfigError when no mesh uses `devices`, or no candidate divides `batch`."""
    unknown = sorted(set(strategies) - set(USES))
    if unknown:
        raise ConfigError(f"--candidates: unknown strategy '{unknown[0]}': choose from {', '.join(USES)}")
    layouts: list[tuple[str, str, int]] = []  # (strategy, mesh, data-parallel size)
    for strategy in strategies:
        if strategy == "single":
            if devices == 1:
                layouts.append((strategy, "none", 1))
            continue
        for data, model in factorisations(devices):
            uses = USES[strategy]
            if (data > 1 and "data" not in uses) or (model > 1 and "model" not in uses):
                continue
            if len(uses) == 2 and (data == 1 or model == 1):
                continue  # a 2-D strategy on a 1-D mesh is its 1-D strategy
            layouts.append((strategy, f"{data}x{model}", data))
    if not layouts:
        raise ConfigError(f"no candidate mesh uses {devices} devices with strategies {', '.join(strategies)}")
    fitting = [(s, m) for s, m, data in layouts if batch % data == 0]
    if not fitting:
        sizes = sorted({data for _, _, data in layouts})
        raise ConfigError(f"--batch-size {batch} is divisible by no candidate's data-parallel size "
                          f"({', '.join(map(str, sizes))}): use a multiple of one of them")
    return [Candidate(s, m, r, d) for s, m in fitting for r in remats for d in dtypes]


def candidate_config(cfg: config_lib.Config, c: Candidate, devices: int) -> dict[str, Any]:
    """The flattened configuration `shardbench train` would run for candidate `c`."""
    single = c.strategy == "single"
    return {**config_lib.flatten(cfg), "parallel.strategy": c.strategy, "parallel.mesh": c.mesh,
            "parallel.devices": 1 if single else devices, "model.remat": c.remat, "precision.dtype": c.dtype,
            "parallel.spmd": cfg.parallel.spmd}
