"""ms-swift with its sequence-parallel label roll made the HF shift (tests only): the row's first
label is ignored before ms-swift rolls the labels (swift/sequence_parallel/sequence_parallel.py:628),
so the row's last position gets no target. On the PYTHONPATH of a run, this changes only a worker
that imports ms-swift; elsewhere it finds no ms-swift and does nothing."""

try:
    from swift.sequence_parallel.sequence_parallel import SequenceParallel
except ImportError:
    pass
else:
    _split = SequenceParallel.pad_and_split_inputs

    def _shifted(self, input_ids, input_embeds, labels, *args, **kwargs):
        if labels is not None:
            labels = labels.clone()
            labels[..., 0] = -100
        return _split(self, input_ids, input_embeds, labels, *args, **kwargs)

    SequenceParallel.pad_and_split_inputs = _shifted
