"""Profiler traces of a window of steps, filed under a name so TensorBoard shows a sweep side by side.

jax.profiler writes `<logdir>/plugins/profile/<timestamp>/`; the folder is renamed to the run's name
(e.g. `mesh_4_2_batch_1024`), which is how the seed arranged eight runs by hand.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import jax


class ProfileWindow:
    """Trace steps (skip, skip + steps]; call `before_step(step)` and `after_step(step)` around each step."""

    def __init__(self, root: Path, run_name: str, skip: int, steps: int, enabled: bool) -> None:
        self.root, self.run_name = root, run_name
        self.first, self.last = skip + 1, skip + steps
        self.enabled = enabled and steps > 0 and jax.process_index() == 0
        self._tmp: Path | None = None
        self.path: Path | None = None

    @property
    def active(self) -> bool:
        return self._tmp is not None

    def before_step(self, step: int) -> None:
        if self.enabled and step == self.first and self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="shardbench-trace-"))
            jax.profiler.start_trace(str(self._tmp))

    def after_step(self, step: int, block: object = None) -> None:
        if self._tmp is not None and step >= self.last:
            if block is not None:
                jax.block_until_ready(block)
            self.stop()

    def stop(self) -> None:
        if self._tmp is None:
            return
        jax.profiler.stop_trace()
        produced = sorted((self._tmp / "plugins" / "profile").glob("*"))
        target = self.root / "plugins" / "profile" / self.run_name
        if produced:
            if target.exists():
                shutil.rmtree(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(produced[-1]), target)
            self.path = target
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp = None
