"""Is XTuner's sequence parallel really what trains? The check on facts read from the built
model (`sequence_parallel_problems`: stdlib only, tests feed it facts directly), and the
worker's collection of those facts (`verify_sequence_parallel`: imports torch, transformers and
xtuner when called, so the module stays importable on the host).

Through the mmengine Runner, XTuner degrades without a word: without flash-attn its
dispatch is skipped (`dispatch_attn_forward` returns when flash-attn 2 is not importable),
so every rank attends only within its own 1/SP shard of the sequence with the stock
attention; an SP group of another size splits the sequence differently. Either trains
something else than the scenario, so the run must fail instead of being measured.
"""

from __future__ import annotations

from collections.abc import Iterable

DISPATCH_PACKAGE = "xtuner.model.modules.dispatch."  # where XTuner's sequence-parallel attention forwards live


def sequence_parallel_problems(requested: int, *, flash_attn_available: bool, attn_implementation: str | None,
                               attention_forwards: Iterable[str], sp_group_size: int) -> list[str]:
    """What is wrong with a model meant to train with sequence parallel `requested`
    (empty when all is bound). `attention_forwards` are the qualified names
    (`module.function`) of the forward bound on each attention module."""
    if requested <= 1:
        return []
    problems = []
    if not flash_attn_available:
        problems.append("flash-attn 2 is not importable, so XTuner skipped its attention dispatch")
    if attn_implementation != "flash_attention_2":
        problems.append(f"the model's attention implementation is {attn_implementation!r}, not 'flash_attention_2'")
    forwards = list(attention_forwards)
    stock = sorted({f for f in forwards if not f.startswith(DISPATCH_PACKAGE)})
    if not forwards:
        problems.append("no attention module found in the model")
    elif stock:
        problems.append(f"{sum(not f.startswith(DISPATCH_PACKAGE) for f in forwards)} of {len(forwards)} attention "
                        f"modules run {', '.join(stock)}, not XTuner's dispatched sequence-parallel forward")
    if sp_group_size != requested:
        problems.append(f"the sequence-parallel group has {sp_group_size} ranks, the scenario asks for {requested}")
    return problems


def verify_sequence_parallel(llm, requested: int) -> None:
    """Fail the run unless XTuner's sequence-parallel attention is what the built model runs:
    flash-attention 2, XTuner's dispatched attention forward on every attention module, an
    SP group of the requested size."""
    if requested <= 1:
        return
    import torch.distributed as dist
    from transformers.utils.import_utils import is_flash_attn_2_available
    from xtuner.parallel.sequence import get_sequence_parallel_group

    group = get_sequence_parallel_group()
    size = dist.get_world_size(group) if dist.is_initialized() and group is not None else 1
    forwards = [f"{fn.__module__}.{fn.__qualname__}" for m in llm.modules() if type(m).__name__.endswith("Attention")
                for fn in [getattr(m.forward, "__func__", m.forward)]]
    problems = sequence_parallel_problems(requested, flash_attn_available=is_flash_attn_2_available(),
                                          attn_implementation=llm.config._attn_implementation,
                                          attention_forwards=forwards, sp_group_size=size)
    if problems:
        raise RuntimeError(f"XTuner's sequence parallel {requested} is not what would train: " + "; ".join(problems))
