"""Sequence parallel in the reference loop, as DeepSpeed-Ulysses (XTuner's and LLaMA-Factory's):
each row's sequence split across the ranks of an SP group, an all-to-all around attention
that trades the sequence split for a head split (every rank attends its heads over the whole
row), and the loss of the row summed over the group.

SP groups are consecutive ranks ([0, sp), [sp, 2 sp), ...), data parallel runs across them:
every rank of a group reads the group's rows (`Layout.dp_rank`). Each rank backpropagates its
slice's share of the row's loss; the group's gradients add up to the row's, which the loop's
DDP or FSDP2 averaging over the whole world divides by SP (the loss is scaled back by SP).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.nn.functional import all_to_all_single

from framework_bench.worker.packed import IGNORE_INDEX

ATTENTION = "sdpa_ulysses"  # the attention implementation the model runs under SP (transformers' registry)


@dataclass(frozen=True)
class Layout:
    sp: int
    rank: int  # in the SP group
    dp_rank: int
    dp_world: int
    group: object  # the SP group's process group


def layout(sp: int, rank: int, world: int) -> Layout:
    """This rank's place, after making every SP group (each rank must create them all, in order)."""
    groups = [torch.distributed.new_group(list(range(first, first + sp))) for first in range(0, world, sp)]
    return Layout(sp=sp, rank=rank % sp, dp_rank=rank // sp, dp_world=world // sp, group=groups[rank // sp])


def _all_to_all(x, lay: Layout):
    """x's first dimension split across the group, slice j sent to rank j; out[j] came from rank j."""
    return all_to_all_single(torch.empty_like(x), x, group=lay.group)


def _seq_to_heads(x, lay: Layout):
    """(batch, heads, len / sp, dim) -> (batch, heads / sp, len, dim): each rank's heads over the whole row."""
    b, h, s, d = x.shape
    out = _all_to_all(x.reshape(b, lay.sp, h // lay.sp, s, d).transpose(0, 1).contiguous(), lay)
    return out.permute(1, 2, 0, 3, 4).reshape(b, h // lay.sp, lay.sp * s, d)  # out[j]: rank j's slice of the row


def _heads_to_seq(x, lay: Layout):
    """(batch, heads / sp, len, dim) -> (batch, len / sp, heads, dim): back to this rank's slice, all heads."""
    b, h, s, d = x.shape
    out = _all_to_all(x.reshape(b, h, lay.sp, s // lay.sp, d).permute(2, 0, 1, 3, 4).contiguous(), lay)
    return out.permute(1, 3, 0, 2, 4).reshape(b, s // lay.sp, lay.sp * h, d)  # out[j]: rank j's heads


def register(lay: Layout) -> str:
    """Registers the Ulysses attention (SDPA over the whole row, causal) with transformers;
    returns its name for `attn_implementation`. K/V heads that the group cannot split are
    repeated to the query heads first, as XTuner does."""
    from transformers import AttentionInterface

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        if key.shape[1] % lay.sp:
            key, value = (t.repeat_interleave(query.shape[1] // key.shape[1], dim=1) for t in (key, value))
        q, k, v = (_seq_to_heads(t, lay) for t in (query, key, value))
        # The mask transformers built covers this rank's slice only: the whole row is causal.
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, scale=scaling, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
        return _heads_to_seq(out, lay), None

    AttentionInterface.register(ATTENTION, attention)
    return ATTENTION


def local(lay: Layout, ids, labels, rolled: bool = False):
    """This rank's slice of the micro-batch: (input_ids, position_ids, labels shifted over the whole
    row: the slice's last token predicts the next slice's first). `rolled`: the row's last position
    predicts its first label, as ms-swift's sequence parallel rolls them (`Job.labels_rolled`)."""
    n = ids.shape[-1] // lay.sp
    lo, hi = lay.rank * n, (lay.rank + 1) * n
    shifted = (torch.roll(labels, -1, -1) if rolled
               else torch.nn.functional.pad(labels[..., 1:], (0, 1), value=IGNORE_INDEX))
    positions = torch.arange(lo, hi, device=ids.device).expand(ids.shape[0], n)
    return ids[..., lo:hi], positions, shifted[..., lo:hi]


def loss(model, loss_function, ids, labels, divisor, lay: Layout, rolled: bool = False):
    """(what this rank backpropagates, the row's loss over the group): the slice's summed token
    loss over the step's divisor, by the model's own loss function, scaled by SP (the world's
    gradient averaging divides by it); the row's loss for the log, with no gradient. `model`:
    the one the loop calls (DDP's wrapper included)."""
    x, positions, shifted = local(lay, ids, labels, rolled)
    logits = model(input_ids=x, position_ids=positions).logits
    mine = loss_function(logits=logits, labels=None, shift_labels=shifted, vocab_size=logits.shape[-1],
                         num_items_in_batch=divisor)
    row = mine.detach().clone()
    torch.distributed.all_reduce(row, group=lay.group)
    return mine * lay.sp, row
