"""Scalar logs: TensorBoard event files (tensorboardX: no TensorFlow needed) and a JSON-lines twin.

The JSON-lines file is what shardbench itself reads back (reports, benchmarks); the event files are for
`tensorboard --logdir <out>/tensorboard`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING


def _import_without_torch() -> type:
    """tensorboardX's SummaryWriter. Its module imports torch wherever torch is installed, only to name torch's
    tensor type in its signatures: a second or so of every run's start (1.1 s of 2.9 s importing the training
    loop, on a 2-core Xeon), for scalars we hand it as plain floats. So torch is hidden while tensorboardX loads
    (it then names numpy's array instead), unless this process has imported torch already."""
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter as writer
        return writer
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError meanwhile
    try:
        from tensorboardX import SummaryWriter as writer
    finally:
        del sys.modules["torch"]
    return writer


if TYPE_CHECKING:
    from tensorboardX import SummaryWriter
else:
    SummaryWriter = _import_without_torch()
from tensorboardX.proto.event_pb2 import Event, SessionLog  # noqa: E402  # after the writer, torch hidden

def _drop_rows_after(path: Path, step: int) -> None:
    """Rewrite the JSON-lines file without its rows past `step` (whole, through a rename: a kill leaves the old
    file or the new). A row that does not parse (the half line a kill can leave) goes too."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
            kept.append(line)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept))
    os.replace(tmp, path)


# tensorboardX writes from a background thread and flushes that thread's file every `flush_secs`; its
# `flush()` does not wait for the queue. One second keeps a killed run's curves to within a second of the kill.
_FLUSH_SECS = 1


class ScalarWriter:
    """Writes scalars to `<logdir>/events.out.tfevents.*` and `<logdir>/metrics.jsonl`."""

    def __init__(self, logdir: Path, enabled: bool = True, resumed_from: int | None = None) -> None:
        """`resumed_from`: the step a resumed run restarts after. What the run logged past it, before it was
        stopped, is logged again as training reaches those steps: the JSON-lines file drops it now, and the event
        file says where the run restarted (a SessionLog START at the step after it, from which TensorBoard drops
        what it had read), so that each shows the new rows only."""
        self.enabled = enabled
        self.logdir = logdir
        self._events: SummaryWriter | None = None
        self._jsonl: IO[str] | None = None
        self._suffix = ""
        if not enabled:
            return
        self._open()
        if resumed_from is not None:
            _drop_rows_after(logdir / "metrics.jsonl", resumed_from)
            assert self._events is not None
            self._events.file_writer.add_event(Event(step=resumed_from + 1, wall_time=time.time(),
                                                     session_log=SessionLog(status=SessionLog.START)))

    def _open(self) -> None:
        self.logdir.mkdir(parents=True, exist_ok=True)
        # tensorboardX names the file by the second and opens it for writing, so a second writer in the
        # same folder within that second (a quick resume) would truncate the first: a unique suffix keeps
        # both, and sorts in creation order after the shared prefix, which is the order TensorBoard reads.
        self._suffix = f".{time.time_ns()}"
        self._events = SummaryWriter(str(self.logdir), flush_secs=_FLUSH_SECS, filename_suffix=self._suffix)
        self._jsonl = open(self.logdir / "metrics.jsonl", "a")

    def _removed(self) -> list[str]:
        """Which of the files this writer has open were deleted since (the folder removed during the run): writing
        on would write into files no one can read."""
        assert self._jsonl is not None
        return [name for name, gone in (
            ("metrics.jsonl", os.fstat(self._jsonl.fileno()).st_nlink == 0),
            ("the event file", not any(self.logdir.glob(f"events.out.tfevents.*{self._suffix}")))) if gone]

    def _reopen_if_removed(self, step: int) -> None:
        if not (gone := self._removed()):
            return
        print(f"shardbench: warning: {' and '.join(gone)} in {self.logdir} deleted during the run: what "
              f"{'they' if len(gone) > 1 else 'it'} held before step {step} is lost, and new files there hold the "
              f"steps from {step} on", file=sys.stderr, flush=True)
        self.close()
        self._open()

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled or self._events is None or self._jsonl is None:
            return
        self._reopen_if_removed(step)
        assert self._events is not None and self._jsonl is not None
        now = time.time()
        clean = {k: float(v) for k, v in scalars.items()}  # jax and numpy scalars to plain floats
        for tag, value in clean.items():
            self._events.add_scalar(tag, value, global_step=step, walltime=now)
        self._jsonl.write(json.dumps({"step": step, "time": now, **clean}) + "\n")
        self.flush()  # a few records a minute: cheap, and a killed run keeps its curves

    def flush(self) -> None:
        if self._events is not None:
            self._events.flush()
        if self._jsonl is not None:
            self._jsonl.flush()

    def close(self) -> None:
        """Drains tensorboardX's queue into the event file and closes both files."""
        if self._events is not None:
            self._events.close()
        if self._jsonl is not None:
            self._jsonl.close()
        self._events = self._jsonl = None
