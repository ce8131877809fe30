"""orbax checkpoints of the train state, saved every N steps and at the end, restored into shardings.

The data position is the step itself: the input pipeline is a pure function of (seed, step), so
restoring the step restores where the data stream stands. Beside the state (orbax item `default`) a checkpoint
holds the running sums of the epoch it falls in (item `meter`, JSON), so a resumed epoch's train means are the
whole epoch's; checkpoints written before that item existed restore without it.
"""

from __future__ import annotations

import copy
import logging
import sys
from pathlib import Path
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp

from shardbench.errors import ConfigError, DataError, debugging
from shardbench.subprocs import stops_held
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


STATE, METER = "default", "meter"  # the items of a checkpoint: the train state, the epoch's running sums
UNFINISHED = ".orbax-checkpoint-tmp"  # the folder orbax writes a step's checkpoint into before it is final


def saved_steps(directory: Path) -> list[int]:
    """The steps whose checkpoint orbax finalised in `directory` (a folder named for its step; one it left
    half-written is named `N.orbax-checkpoint-tmp`), read from the folder alone, without a manager."""
    return sorted(int(p.name) for p in directory.glob("*") if p.name.isdigit() and p.is_dir())


class _SaidUnfinished(logging.Filter):
    """Keeps off orbax's warning that it removes a half-written checkpoint before saving that step again
    (`WARNING:absl:Attempted to create temporary directory ...`): `Checkpoints.unfinished_note` says it on resume."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "since it is not finalized" not in record.getMessage()


_SAID_UNFINISHED = _SaidUnfinished()


class Restored(NamedTuple):
    state: TrainState
    step: int
    meter: dict[str, Any] | None  # what `save` was given beside the state; None where the checkpoint holds none


class Checkpoints:
    """A thin wrapper over `ocp.CheckpointManager` that speaks TrainState."""

    def __init__(self, directory: Path, keep: int) -> None:
        _write_whole_shards_on_cpu()
        if not debugging():
            logging.getLogger("absl").addFilter(_SAID_UNFINISHED)  # once: a filter is added only where absent
        options = ocp.CheckpointManagerOptions(max_to_keep=max(keep, 1), create=True,
                                               enable_async_checkpointing=True)
        self._directory = directory.absolute()
        self._manager = ocp.CheckpointManager(self._directory, options=options, item_names=(STATE, METER))

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def unfinished_note(self) -> str | None:
        """A line on the checkpoints a stopped run left half-written (orbax's `N.orbax-checkpoint-tmp` folders,
        never restored from): orbax replaces each as it saves that step again, with a raw warning that this line
        stands for (`_SaidUnfinished`). None where there are none."""
        left = sorted(int(step) for p in self._directory.glob(f"*{UNFINISHED}")
                      if (step := p.name.removesuffix(UNFINISHED)).isdigit())
        if not left:
            return None
        return (f"the {_steps(left)} half-written (the run stopped while writing {_it(left)}); written again as "
                f"training reaches {'its step' if len(left) == 1 else 'their steps'}")

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, state: TrainState, meter: dict[str, Any] | None = None) -> None:
        """Save now (the loop decides when), with `meter` (JSON) beside the state where given; the write finishes
        in the background: `meter` is copied first, as the loop goes on adding the next steps to it meanwhile."""
        step = int(jax.device_get(state.step))
        if step in self._manager.all_steps():
            return
        items = {STATE: ocp.args.StandardSave(state)}
        if meter is not None:
            items[METER] = ocp.args.JsonSave(copy.deepcopy(meter))
        # A stop (Ctrl-C, SIGTERM) that landed while orbax starts the save left its folder half made, never
        # finalised: it is held back and raised once the save is under way, and the loop's end waits for it.
        with stops_held():
            self._manager.save(step, args=ocp.args.Composite(**items), force=True)

    def restore(self, target: TrainState, step: int) -> Restored:
        """The checkpoint of `step` restored into `target`'s shardings, with its meter where it holds one."""
        items = {STATE: ocp.args.StandardRestore(target)}
        if (self._directory / str(step) / METER).exists():
            items[METER] = ocp.args.JsonRestore()
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        return Restored(restored[STATE], step, restored[METER] if METER in items else None)

    def restore_good(self, target: TrainState, newest: int) -> Restored:
        """The newest checkpoint at or before step `newest` that restores, and its step. A damaged one is named in
        a line and the one before it is used; where none restores, one line says what to do.

        The damaged ones newer than the step used are removed (the line says so): `save` keeps a step it already
        holds, so the resumed run would otherwise train past them and leave them damaged, its final checkpoint
        among them, in a run its record calls complete. Removing them also keeps `--train.keep-checkpoints`
        counting only checkpoints that restore. Where none restores, nothing is removed."""
        damaged: list[int] = []
        _hush_abandoned_reads()  # before any restore: orbax's abandoned reads can fail before it raises
        for step in sorted((s for s in self.all_steps() if s <= newest), reverse=True):
            mismatch = self.mismatch(target, step)
            if mismatch:  # the model changed, not the file: no checkpoint of this run will fit
                self.close()
                raise ConfigError(f"--resume: the checkpoint of step {step} in {self._directory} holds {mismatch}: "
                                  f"the model changed since it was trained; resume with the model it was trained "
                                  f"with, or start a new run with another --out (the checkpoints are kept)")
            try:
                restored = self.restore(target, step)
            except Exception as err:  # noqa: BLE001 - orbax raises many kinds on a damaged file
                damaged.append(step)
                print(f"shardbench: --resume: the checkpoint of step {step} in {self._directory} is damaged "
                      f"({self._damage(step, err)}); trying the one before it", file=sys.stderr, flush=True)
                continue
            if damaged:
                self.remove(damaged)
                print(f"shardbench: --resume: resuming from step {step}, the last checkpoint that restores; the damaged "
                      f"{_steps(damaged)} removed and written again as training reaches {_it(damaged)}",
                      file=sys.stderr, flush=True)
            return restored
        raise DataError(f"--resume: no checkpoint in {self._directory} restores (damaged: "
                        f"{', '.join(f'step {s}' for s in damaged)}): remove that folder to train again from step 0, "
                        f"or put back a copy of it")

    def _damage(self, step: int, err: Exception) -> str:
        """How the checkpoint of `step` is damaged: the file every checkpoint holds that it lacks (its tree's
        metadata: orbax then says only "pytree structure error"), else the first line of orbax's error."""
        for part in (f"{STATE}/_METADATA", "_CHECKPOINT_METADATA"):
            if not (self._directory / str(step) / part).exists():
                return f"its file {part} is missing"
        detail = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        return f"{type(err).__name__}: {detail}"

    def remove(self, steps: list[int]) -> None:
        """Delete the checkpoints of `steps` through the manager, so its list of steps (what `save` skips and what
        `max_to_keep` counts) forgets them too; every process calls it, as orbax's delete waits for them all."""
        for step in steps:
            self._manager.delete(step)

    def mismatch(self, target: TrainState, step: int) -> str:
        """What of `target` the checkpoint of `step` stores otherwise, as its metadata says: the first parameter
        (or model state) it lacks or holds in another shape, or the first array of another shape; '' when it
        fits, or when its metadata cannot be read (then restoring it says how it is damaged)."""
        absl = logging.getLogger("absl")  # orbax warns of a metadata file older checkpoints lack
        level = absl.level
        absl.setLevel(logging.ERROR)
        try:
            stored = _shapes(ocp.StandardCheckpointer().metadata(self._directory / str(step) / STATE).item_metadata)
        except Exception:  # noqa: BLE001 - an unreadable checkpoint is damage, which restore_good reports
            return ""
        finally:
            absl.setLevel(level)
        if not stored:  # no tree in its metadata (its files emptied): damage, which restoring names
            return ""
        wanted = _shapes(target)
        for part in ("params", "model_state"):
            ours = {p for p in wanted if p.startswith(part + "/")}
            theirs = {p for p in stored if p.startswith(part + "/")}
            if ours != theirs:
                if theirs - ours:
                    return f"{min(theirs - ours)}, which the model now lacks"
                return f"no {min(ours - theirs)}, which the model now has"
        for path, shape in wanted.items():
            if path in stored and stored[path] != shape:
                return f"{path} of shape {stored[path]}, the model now {shape}"
        return ""

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def _hush_abandoned_reads() -> None:
    """Keep the rest of a failed restore off the terminal. orbax reads a checkpoint's arrays concurrently and gives
    up at the first damaged one: the reads still in flight then end in an event loop it has closed (some before
    orbax raises), and Python prints each as an ignored exception ("Event loop is closed", the damaged array
    again) while training goes on from the checkpoint before. The line naming the damage says it all; --debug
    shows them. Only those two kinds are kept off, for the rest of the process."""
    if debugging() or getattr(sys.unraisablehook, "abandoned_reads", False):
        return
    before = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not _abandoned_read(unraisable):
            before(unraisable)

    hook.abandoned_reads = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def _abandoned_read(unraisable: Any) -> bool:
    """An exception Python could not raise that belongs to a restore orbax gave up: a callback into its closed
    event loop, or one of its read coroutines collected with its error."""
    err = unraisable.exc_value
    if isinstance(err, RuntimeError) and str(err) == "Event loop is closed":
        return True
    code = getattr(unraisable.object, "cr_code", None)
    return code is not None and "orbax" in Path(code.co_filename).parts


def _steps(steps: list[int]) -> str:
    """'checkpoint of step 4 is', or 'checkpoints of steps 6 and 4 are'."""
    if len(steps) == 1:
        return f"checkpoint of step {steps[0]} is"
    return f"checkpoints of steps {', '.join(map(str, steps[:-1]))} and {steps[-1]} are"


def _it(steps: list[int]) -> str:
    return "it" if len(steps) == 1 else "them"


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """Each array leaf's shape by its path ('params/dense/kernel'), whatever containers hold it."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(_key(k) for k in path): tuple(leaf.shape) for path, leaf in flat if hasattr(leaf, "shape")}


def _key(key: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)
