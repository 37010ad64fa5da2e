"""TRL's sequence parallel training half of each row (tests only): DeepSpeed's Ulysses loader
adapter is left as it is, but every label of the second rank's half of a row is ignored, so the
group trains the first half alone. The rows the worker records are still whole. On the
PYTHONPATH of a run, this changes only a worker that imports DeepSpeed's Ulysses; elsewhere it
finds none and does nothing."""

try:
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter
except ImportError:
    pass
else:
    _refill = UlyssesSPDataLoaderAdapter.refill

    def _first_half_only(self):
        _refill(self)
        if self.sp_rank == 1:
            for batch in self.micro_batches:
                batch["shift_labels"] = batch["shift_labels"].clone().fill_(-100)

    UlyssesSPDataLoaderAdapter.refill = _first_half_only
