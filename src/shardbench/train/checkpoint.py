"""orbax checkpoints of the train state, saved every N steps and at the end, restored into shardings.

The data position is the step itself: the input pipeline is a pure function of (seed, step), so
restoring the step restores where the data stream stands.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from shardbench.errors import DataError
from shardbench.train.state import TrainState


_whole_shards = False  # registered in this process already


def _write_whole_shards_on_cpu() -> None:
    """orbax's default splits each replicated array between its replicas before writing ("replica parallel"),
    slicing on the device: on CPU every array shape costs a compilation (105 of them, 6 s, for a 24k-parameter
    ViT on 8 simulated devices), and the devices share one disk anyway. There, one replica writes each shard."""
    global _whole_shards
    if _whole_shards or jax.default_backend() != "cpu":
        return
    absl = logging.getLogger("absl")  # orbax warns that a handler is replaced: here that is the point
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        ocp.type_handlers.register_type_handler(jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False),
                                                override=True)
    finally:
        absl.setLevel(level)
    _whole_shards = True


class Checkpoints:
    """A thin wrapper over `ocp.CheckpointManager` that speaks TrainState."""

    def __init__(self, directory: Path, keep: int) -> None:
        _write_whole_shards_on_cpu()
        options = ocp.CheckpointManagerOptions(max_to_keep=max(keep, 1), create=True,
                                               enable_async_checkpointing=True)
        self._directory = directory.absolute()
        self._manager = ocp.CheckpointManager(self._directory, options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, state: TrainState) -> None:
        """Save now (the loop decides when); the write finishes in the background."""
        step = int(jax.device_get(state.step))
        if step in self._manager.all_steps():
            return
        self._manager.save(step, args=ocp.args.StandardSave(state), force=True)

    def restore(self, target: TrainState, step: int | None = None) -> TrainState:
        step = self.latest_step() if step is None else step
        return self._manager.restore(step, args=ocp.args.StandardRestore(target))

    def restore_good(self, target: TrainState, newest: int) -> tuple[TrainState, int]:
        """The newest checkpoint at or before step `newest` that restores, and its step. A damaged one is named in
        a line and the one before it is used; where none restores, one line says what to do."""
        damaged: list[str] = []
        for step in sorted((s for s in self.all_steps() if s <= newest), reverse=True):
            try:
                state = self._manager.restore(step, args=ocp.args.StandardRestore(target))
            except Exception as err:  # noqa: BLE001 - orbax raises many kinds on a damaged file
                detail = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
                damaged.append(f"step {step}")
                print(f"shardbench: --resume: the checkpoint of step {step} in {self._directory} is damaged "
                      f"({type(err).__name__}: {detail}); trying the one before it", file=sys.stderr, flush=True)
                continue
            if damaged:
                print(f"shardbench: --resume: resuming from step {step}, the last checkpoint that restores",
                      file=sys.stderr, flush=True)
            return state, step
        raise DataError(f"--resume: no checkpoint in {self._directory} restores (damaged: {', '.join(damaged)}): "
                        f"remove that folder to train again from step 0, or put back a copy of it")

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
