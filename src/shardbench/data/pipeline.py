"""Host input pipeline: whole batches as grain records, seeded per-epoch shuffles, thread prefetch.

A record is a full batch, so the per-record overhead of grain is paid once per batch, not per image.

Repeated augmentation (`repeats` k > 1; Hoffer et al., 2020, and DeiT's RASampler) is decided here: a
training batch holds B/k distinct images, the block of them then k - 1 more copies of it, each copy in its own
seeded order ([a, b, c, d, c, a, d, b] for k = 2), and the device augments every row with its own draws, so each
image is seen k times differently. Each copy sits in its own B/k rows, so the copies spread over the devices as
RASampler's do. The pair partners of mixing (rows 2i, 2i+1) are always different images, and, the copies being
in different orders, mostly different ones for each copy (tiling the block k times would mix every copy of a
with the same b). An epoch stays one pass over the distinct images (k times the steps of an epoch without
repeats), as in the SPT/LSA ViT code, whose 100 epochs at k = 3 are about 300 passes of augmented images; DeiT's
RASampler keeps the epoch's length instead and sees only 1/k of the images in each. Chosen so that `--epochs`
keeps counting passes over the dataset and no image is left out of an epoch.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grain
import numpy as np
from grain.experimental import ThreadPrefetchIterDataset

from shardbench.data.arrays import Split
from shardbench.data.epochs import eval_steps, steps_per_epoch
from shardbench.errors import ConfigError

Batch = dict[str, np.ndarray]
# Length given to grain for an endless training stream; a 64-bit index never gets there.
_ENDLESS = 2**62


class BatchSource:
    """Random-access source whose item i is the i-th global batch (this process's slice of it).

    With `repeat` (training) the stream is endless: batch i belongs to epoch i // steps_per_epoch,
    which visits the examples in the order of permutation PCG64([seed, epoch]) (or in order
    without `shuffle`), dropping the remainder. Without `repeat` (evaluation) it is one pass whose
    last batch is padded with mask=False rows. `repeats` k (training only): each batch is global_batch / k
    consecutive examples of that order, then k - 1 copies of them, each in the order of permutation
    PCG64([seed, epoch, step, copy]) (see the module's docstring).
    """

    def __init__(
        self,
        arrays: Split,
        *,
        global_batch: int,
        seed: int,
        shuffle: bool,
        repeat: bool,
        process_index: int = 0,
        process_count: int = 1,
        repeats: int = 1,
    ) -> None:
        if global_batch < 1:
            raise ConfigError(f"global batch size is {global_batch}; it must be at least 1")
        if process_count < 1 or not 0 <= process_index < process_count:
            raise ConfigError(f"process index {process_index} of {process_count} processes is invalid; "
                              "it must be in [0, process_count)")
        if global_batch % process_count:
            raise ConfigError(f"global batch size {global_batch} does not divide by the {process_count} "
                              "processes; pick a multiple of the process count")
        if repeats < 1 or global_batch % repeats or (repeat and repeats > 1 and global_batch // repeats < 2):
            raise ConfigError(f"global batch size {global_batch} does not hold {repeats} copies of at least 2 "
                              f"distinct images; pick a multiple of {repeats} of at least {2 * repeats}")
        n = len(arrays)
        self._repeats = repeats if repeat else 1
        distinct = global_batch // self._repeats
        if repeat and n < distinct:
            raise ConfigError(f"global batch size {global_batch} is larger than the {n} training examples; "
                              "use a smaller batch")
        self._columns = dict(arrays.columns())
        self._n = n
        self._global_batch = global_batch
        self._seed = seed
        self._shuffle = shuffle
        self._repeat = repeat
        per_process = global_batch // process_count
        # This process's contiguous rows of every global batch.
        self._lo, self._hi = process_index * per_process, (process_index + 1) * per_process
        self._steps_per_epoch = (steps_per_epoch(n, global_batch, self._repeats) if repeat
                                 else eval_steps(n, global_batch))
        self._perms: dict[int, np.ndarray] = {}
        # grain may read records from several threads; the permutation cache is shared.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return _ENDLESS if self._repeat else self._steps_per_epoch

    def _order(self, epoch: int) -> np.ndarray:
        """Example order of `epoch`: computed once per epoch (N log N), reused by its batches."""
        with self._lock:
            perm = self._perms.get(epoch)
            if perm is None:
                if self._shuffle:
                    perm = np.random.Generator(np.random.PCG64([self._seed, epoch])).permutation(self._n)
                else:
                    perm = np.arange(self._n)
                # Only the current epoch (and the one a prefetching thread has moved on to) matter.
                self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
                self._perms[epoch] = perm
            return perm

    def __getitem__(self, index: int) -> Batch:
        index = int(index)
        if index < 0 or index >= len(self):
            raise IndexError(f"batch {index} is out of range [0, {len(self)})")
        epoch, step = divmod(index, self._steps_per_epoch) if self._repeat else (0, index)
        if self._repeats > 1:
            distinct = self._global_batch // self._repeats
            copies = [np.arange(step * distinct, (step + 1) * distinct)]
            for copy in range(1, self._repeats):
                order = np.random.Generator(np.random.PCG64([self._seed, epoch, step, copy])).permutation(distinct)
                positions = copies[0][order]
                if distinct % 2 and positions[0] == copies[-1][-1]:  # a pair straddling two copies: two images
                    positions[[0, 1]] = positions[[1, 0]]
                copies.append(positions)
            positions = np.concatenate(copies)[self._lo:self._hi]
        else:
            start = step * self._global_batch
            positions = np.arange(start + self._lo, start + self._hi)
        valid = positions < self._n  # only ever False in the padded last evaluation batch
        idx = self._order(epoch)[positions[valid]]
        b = len(positions)
        out: Batch = {}
        for name, column in self._columns.items():
            if valid.all():
                out[name] = column[idx]
            else:
                # Padding rows are zeros with mask=False, so metrics can skip them.
                out[name] = np.zeros((b, *column.shape[1:]), dtype=column.dtype)
                out[name][: len(idx)] = column[idx]
        out["mask"] = valid
        return out


def _closing(it: Iterator[Batch]) -> Iterator[Batch]:
    """Yields from a grain iterator and closes it when the consumer stops, so the prefetch
    thread does not stay parked on a full queue holding batches."""
    try:
        yield from it
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def make_batches(
    arrays: Split,
    *,
    global_batch: int,
    seed: int,
    shuffle: bool,
    start_step: int = 0,
    num_steps: int | None = None,
    process_index: int = 0,
    process_count: int = 1,
    prefetch: int = 2,
    repeat: bool | None = None,
    repeats: int = 1,
) -> Iterator[Batch]:
    """Batches of `arrays` as dicts of its columns (images: image uint8 (b,H,W,3), label int32 (b,)) plus
    mask bool (b,).

    b = global_batch // process_count. `repeat` defaults to `shuffle`: shuffled batches form the
    endless training stream, unshuffled ones a single padded evaluation pass. The stream starts
    at batch `start_step` (a resumed run continues where it stopped) and yields at most
    `num_steps` batches; `prefetch` batches are prepared ahead in a background thread. `repeats` k > 1: each
    training batch holds global_batch / k distinct examples k times (repeated augmentation).
    """
    if start_step < 0 or (num_steps is not None and num_steps < 0):
        raise ConfigError(f"start_step {start_step} and num_steps {num_steps} must not be negative")
    source = BatchSource(
        arrays,
        global_batch=global_batch,
        seed=seed,
        shuffle=shuffle,
        repeat=shuffle if repeat is None else repeat,
        process_index=process_index,
        process_count=process_count,
        repeats=repeats,
    )
    stop = None if num_steps is None else start_step + num_steps
    ds = grain.MapDataset.source(source)[start_step:stop]
    # Records are read inline by the prefetch thread below: one thread keeps up (a batch is one
    # gather), and more would only contend for the GIL with the training loop.
    it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    if prefetch > 0:
        it_ds = ThreadPrefetchIterDataset(it_ds, prefetch_buffer_size=prefetch)
    return _closing(iter(it_ds))
