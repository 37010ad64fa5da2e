"""One scenario as `fbench show` presents it: its FLOPs per token by both formulas, its memory
estimate on a GPU, and the lines that say them with its model, cluster, training and steps."""

from __future__ import annotations

from rich.text import Text

from framework_bench.present.chart_style import ctx_label
from framework_bench.present.run_lines import highlighted


def hardware(s) -> str | None:
    """The GPU a scenario is judged on without --gpu: its published reference's."""
    return s.reference.hardware if s.reference else None


def scenario_summary(s, gpu: str | None = None) -> dict:
    """What `show` prints, judged on `gpu` (--gpu, a `gpus.MODELS` name) or the scenario's hardware."""
    from framework_bench.measure import flops
    from framework_bench.measure.memory import estimate
    from framework_bench.scenario.models import parameter_counts
    counts = parameter_counts(s.arch)
    recompute = s.activation_checkpointing
    mha = flops.mha_flops_per_token(s.arch, s.context_length, recompute)
    model = flops.scenario_model_flops_per_token(s, recompute)
    out = {
        "name": s.name, "gpus": s.cluster.gpus, "nodes": s.cluster.nodes, "gpus_per_node": s.cluster.gpus_per_node,
        "context_length": s.context_length, "sequence_parallel": s.sequence_parallel,
        "reference": s.reference.model_dump() if s.reference else None,
        # the key keeps its first name: `fbench show --json` readers and the golden files use it
        "flops": {"xtuner_per_token": mha, "model_per_token": model},
        "scenario": s.model_dump(mode="json"),
        "model": s.arch.model_dump(),
        "parameters": {"total": counts["model"], "active": counts["active"]},
        "memory": estimate(s, gpu=gpu or hardware(s)),
    }
    if s.reference:
        out["flops"]["xtuner_tflops_at_reference_tgs"] = flops.tflops(s.reference.tgs, mha)
        out["flops"]["model_tflops_at_reference_tgs"] = flops.tflops(s.reference.tgs, model)
    return out


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def model_line(s, parameters: dict) -> str:
    """'qwen3-30b-a3b (qwen3_moe): hidden 2048, ...; 128 experts, top-8, width 768; 30.53 B parameters,
    3.35 B active': the model's source, family, shapes and size."""
    a = s.arch
    source = s.model.preset or (f"config_file {s.model.config_file}" if s.model.config_file else "inline")
    head = f", head_dim {a.head_dim}" if a.head_dim else ""
    experts = (f"; {a.num_experts} experts, top-{a.num_experts_per_tok}, width {a.moe_intermediate_size}"
               + (f", shared expert {a.shared_expert_intermediate_size}" if a.shared_expert_intermediate_size else "")
               if a.family.moe else "")
    size = f"{_count(parameters['total'])} parameters"
    if parameters["active"] != parameters["total"]:
        size += f", {_count(parameters['active'])} active"
    return (f"{source} ({a.architecture}): hidden {a.hidden_size}, layers {a.num_hidden_layers}, heads "
            f"{a.num_attention_heads}/{a.num_key_value_heads} KV{head}, ffn {a.intermediate_size}, vocab {a.vocab_size}"
            f"{experts}; {size}")


def scenario_lines(s, info: dict, gpu: str | None = None) -> list[Text]:
    """`fbench show`'s lines of a scenario and its `scenario_summary` (`info`); with `gpu`, its
    memory answers whether it fits there first."""
    from framework_bench.run.launchers.slurm_time import estimate_time
    f, memory = info["flops"], info["memory"]
    adapters = s.finetune.method != "full"
    model = "model (GQA-exact, frozen base + adapters)" if adapters else "model (GQA-exact)"
    out = [highlighted(Text.assemble((s.name, "bold"), f"  {s.description}")), *map(highlighted, map(Text, [
        f"model      {model_line(s, info['parameters'])}",
        f"cluster    {s.cluster.nodes} node(s) x {s.cluster.gpus_per_node} {s.cluster.device} = {s.cluster.gpus}",
        f"training   context {s.context_length:,} ({ctx_label(s.context_length)}), SP {s.sequence_parallel}, "
        f"micro batch {s.micro_batch}, grad accum {s.grad_accum}, ZeRO {s.zero_stage}, "
        f"checkpointing {s.activation_checkpointing}, {s.precision}, attention {s.attention}",
        f"steps      {s.steps.warmup} warm-up + {s.steps.measured} measured; {s.rows_needed} rows needed"]))]
    if adapters:
        out.append(Text(f"finetune   {s.finetune.summary(s.arch)}"))
    out.append(highlighted(Text(f"FLOPs/tok  XTuner formula {f['xtuner_per_token']:.4g}; {model} "
                               f"{f['model_per_token']:.4g}")))
    # with --gpu, the answer first, then what it is made of
    out.append(Text(f"memory     {memory.fit_line(gpu)}\n           {memory.breakdown()}" if gpu
                    else f"memory     {memory.summary()}"))
    out.append(Text(f"slurm      {estimate_time(s, gpu or hardware(s)).summary()}"))
    if s.reference:
        r = s.reference
        out.append(highlighted(Text(f"published  {r.framework} on {r.hardware}: TGS {r.tgs}, TFLOPs {r.tflops} "
                                   f"(formula gives {f['xtuner_tflops_at_reference_tgs']:.1f}; model FLOPs "
                                   f"{f['model_tflops_at_reference_tgs']:.1f})")))
    return out
