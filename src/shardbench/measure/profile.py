"""Profiler traces of a window of steps, filed under a name so TensorBoard shows a sweep side by side.

jax.profiler writes `<logdir>/plugins/profile/<timestamp>/`; the folder is renamed to the run's name
(e.g. `mesh_4_2_batch_1024`), which is how the seed arranged eight runs by hand.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
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

    def before_step(self, step: int, settle: object = None) -> None:
        """Start the trace before step `step` where it is the window's first. `settle`: what the steps before it
        computed, waited for first: a step still running when the trace starts (the device runs behind the host)
        was traced too, one step more than the window's."""
        if self.enabled and step == self.first and self._tmp is None:
            if settle is not None:
                jax.block_until_ready(settle)
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
        try:
            self._file(sorted((self._tmp / "plugins" / "profile").glob("*")))
        finally:  # a trace that could not be filed (a full disk) leaves no temporary folder behind either
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    @contextlib.contextmanager
    def abandoned_on_error(self) -> Iterator[None]:
        """A run stopped (Ctrl-C, SIGTERM) or failed inside the window ends the trace and removes its temporary
        folder: the steps traced so far are not the window, and nothing is filed as if they were."""
        try:
            yield
        except BaseException:
            if self._tmp is not None:
                try:
                    jax.profiler.stop_trace()
                except Exception:  # noqa: BLE001 - the run's own error is the one to report
                    pass
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = None
            raise

    def _file(self, produced: list[Path]) -> None:
        """Move the newest trace jax wrote into the run's folder under the profile root."""
        if not produced:
            return
        profiles = self.root / "plugins" / "profile"
        target = run_folder(profiles, self.run_name)
        if target is not None and target.is_dir():
            shutil.rmtree(target)  # the same run's earlier trace
        if target is None or target.exists():  # no folder of its own there: the trace keeps jax's name
            target = profiles / produced[-1].name
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(produced[-1]), target)
            self.path = target


def run_folder(profiles: Path, run_name: str) -> Path | None:
    """The folder a run's trace takes under `profiles` (`<root>/plugins/profile`): the one folder named
    `run_name` directly in it, or None where the name would lead anywhere else (absolute, '', '.', '..', a path,
    a link), so that the earlier trace a new one replaces is never a folder outside."""
    if not run_name or run_name in (".", "..") or Path(run_name).name != run_name or "\\" in run_name:
        return None
    target = profiles / run_name
    if target.is_symlink() or target.resolve().parent != profiles.resolve():
        return None
    return target
