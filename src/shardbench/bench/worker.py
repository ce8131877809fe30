"""One benchmark case in a fresh process, driven over a line protocol on stdin/stdout.

`python -m shardbench.bench.worker CASE KWARGS_JSON`. The worker answers with one JSON line each time:
  on start       {"ready": info} once the contender is built and its first step has run,
                 {"result": figures} for a one-shot case, {"skipped": why} or {"error": what};
  "steps N"      runs N steps, waits for the last, answers {"seconds": elapsed};
  "memory"       answers {"peak_bytes": the device's allocator peak so far, or null where unknown};
  "quit"         exits.
Anything libraries print goes to stderr (the driver's log), never into the protocol. A case that asks
for one core (`"one_core": true`) is pinned before JAX starts, so XLA sizes its thread pool for it.
The persistent compilation cache stays off: compile times must be real compilations.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import IO, Any


def _send(channel: IO[str], message: dict[str, Any]) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def _error(err: BaseException) -> dict[str, str]:
    traceback.print_exc()
    return {"error": f"{type(err).__name__}: {err}".splitlines()[0][:300]}


def main(argv: list[str]) -> int:
    case, kwargs_json = argv
    kwargs = json.loads(kwargs_json)
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints (torch.compile, XLA) go to the log
    sys.stdout = sys.stderr
    if kwargs.get("one_core") and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    from shardbench.bench.cases import CONTENDERS, ONE_SHOT, Skipped

    if case in ONE_SHOT:
        try:
            _send(channel, {"result": ONE_SHOT[case](**kwargs)})
            return 0
        except Exception as err:  # noqa: BLE001 - any failure is reported to the driver, which goes on
            _send(channel, _error(err))
            return 1
    try:
        prepared = CONTENDERS[case](**kwargs)
    except Skipped as why:
        _send(channel, {"skipped": str(why)})
        return 0
    except Exception as err:  # noqa: BLE001
        _send(channel, _error(err))
        return 1
    device = jax.devices()[0]
    _send(channel, {"ready": {**prepared.info, "work_per_step": prepared.work_per_step, "unit": prepared.unit,
                              "platform": device.platform, "device_kind": device.device_kind}})
    for line in sys.stdin:
        command = line.split()
        if not command or command[0] == "quit":
            break
        try:
            if command[0] == "memory":
                _send(channel, {"peak_bytes": prepared.peak_bytes()})
                continue
            start = time.perf_counter()
            out = None
            for _ in range(int(command[1])):
                out = prepared.step()
            prepared.wait(out)
            _send(channel, {"seconds": time.perf_counter() - start})
        except Exception as err:  # noqa: BLE001
            _send(channel, _error(err))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
