"""`fbench scenarios`, `show`, `validate`, `schema`, `pack`: the scenarios and their packed data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.text import Text

from framework_bench.cli import common, render


def scenarios(wide: common.WideOption = False) -> None:
    """List the scenarios in scenarios/.

    Example: fbench scenarios --wide"""
    from framework_bench.scenario import scenario
    t = render.FittedTable("scenarios", [
        render.Col("name"), render.Col("model"), render.Col("device"), render.Col("GPUs", "right"),
        render.Col("context", "right"), render.Col("SP", "right"), render.Col("ZeRO", "right"),
        render.Col("published TGS", "right"), render.Col("notes", kind="notes")],
        more="--wide, or `fbench show NAME`", wide=wide)
    for p in scenario.scenario_paths():
        try:
            s = scenario.load_file(p)
        except scenario.ScenarioError as e:
            t.add_row(p.stem, Text("invalid", style="red"), "", "", "", "", "", "", [str(e).splitlines()[0]])
            continue
        notes = [f"yours ({p}), over the bundled one"] if scenario.shadowing(p) else []
        t.add_row(s.name, s.model.preset or "inline", s.cluster.device, str(s.cluster.gpus), render.ctx(s.context_length),
                  str(s.sequence_parallel), str(s.zero_stage), render.fmt(s.reference.tgs if s.reference else None), notes)
    render.show(t)


def hardware(s) -> str | None:
    """The GPU a scenario is judged on without --gpu: its published reference's."""
    return s.reference.hardware if s.reference else None


def scenario_summary(s, gpu: str | None = None) -> dict:
    """What `show` prints, judged on `gpu` (--gpu, a `gpus.MODELS` name) or the scenario's hardware."""
    from framework_bench.measure import flops
    from framework_bench.measure.memory import estimate
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
        "memory": estimate(s, gpu=gpu or hardware(s)),
    }
    if s.reference:
        out["flops"]["xtuner_tflops_at_reference_tgs"] = flops.tflops(s.reference.tgs, mha)
        out["flops"]["model_tflops_at_reference_tgs"] = flops.tflops(s.reference.tgs, model)
    return out


def show(
    name: Annotated[Optional[str], typer.Argument(metavar="NAME", help="scenario name or file (or --scenario)")] = None,
    scenario: Annotated[Optional[str], typer.Option(
        "--scenario", metavar="NAME",
        help="scenario name or file, as compare takes it, e.g. --scenario llama2_7b_32k_1gpu")] = None,
    as_json: Annotated[bool, common.Flag("--json", help="one JSON object")] = False,
    gpu: common.GpuOption = None,
) -> None:
    """Show a validated scenario with its FLOPs per token by both formulas; with --gpu, whether it fits on that GPU.

    Example: fbench show llama2_7b_32k_1gpu --gpu A100-80G"""
    if (name is None) == (scenario is None):
        common.fail("give the scenario once: `fbench show NAME` or `fbench show --scenario NAME`")
    s = common.load_scenario(name if name is not None else scenario)
    gpu = common.gpu_named(gpu)
    info = scenario_summary(s, gpu)
    if as_json:
        print(json.dumps({**info, "memory": info["memory"].model_dump()}, indent=2))
        return
    common.console.print(f"[bold]{s.name}[/bold]  {escape(s.description)}")
    a = s.arch
    common.console.print(f"model      {s.model.preset or 'inline'}: hidden {a.hidden_size}, layers {a.num_hidden_layers}, "
                  f"heads {a.num_attention_heads}/{a.num_key_value_heads} KV, ffn {a.intermediate_size}, vocab {a.vocab_size}")
    common.console.print(f"cluster    {s.cluster.nodes} node(s) x {s.cluster.gpus_per_node} {s.cluster.device} = {s.cluster.gpus}")
    common.console.print(f"training   context {s.context_length:,} ({render.ctx(s.context_length)}), SP {s.sequence_parallel}, "
                  f"micro batch {s.micro_batch}, grad accum {s.grad_accum}, ZeRO {s.zero_stage}, "
                  f"checkpointing {s.activation_checkpointing}, {s.precision}, attention {s.attention}")
    common.console.print(f"steps      {s.steps.warmup} warm-up + {s.steps.measured} measured; {s.rows_needed} rows needed")
    adapters = s.finetune.method != "full"
    if adapters:
        common.console.print(f"finetune   {s.finetune.summary(s.arch)}", highlight=False, markup=False)
    f = info["flops"]
    model = "model (GQA-exact, frozen base + adapters)" if adapters else "model (GQA-exact)"
    common.console.print(f"FLOPs/tok  XTuner formula {f['xtuner_per_token']:.4g}; {model} {f['model_per_token']:.4g}")
    memory = info["memory"]
    if gpu:  # the answer first, then what it is made of
        common.console.print(f"memory     {memory.fit_line(gpu)}\n           {memory.breakdown()}", highlight=False,
                             markup=False)
    else:
        common.console.print(f"memory     {memory.summary()}", highlight=False)
    from framework_bench.run.launchers.slurm_time import estimate_time
    common.console.print(f"slurm      {estimate_time(s, gpu or hardware(s)).summary()}",
                  highlight=False, markup=False)
    if s.reference:
        r = s.reference
        common.console.print(f"published  {r.framework} on {r.hardware}: TGS {r.tgs}, TFLOPs {r.tflops} "
                      f"(formula gives {f['xtuner_tflops_at_reference_tgs']:.1f}; model FLOPs {f['model_tflops_at_reference_tgs']:.1f})")


def validate(files: Annotated[list[Path], typer.Argument(metavar="FILE", help="scenario files, one or more")]) -> None:
    """Validate scenario files; exit 1 listing each bad field.

    Example: fbench validate scenarios/tiny_cpu.yaml"""
    from framework_bench.scenario import scenario
    bad = 0
    for f in files:
        try:
            scenario.load_file(f)
            common.console.print(f"[green]ok[/green] {escape(str(f))}", highlight=False)
        except scenario.ScenarioError as e:
            bad += 1
            for line in str(e).splitlines():
                common.err.print(f"[red]error:[/red] {escape(line)}", highlight=False, soft_wrap=True)
    if bad:
        raise typer.Exit(1)


def schema() -> None:
    """Print the JSON schema of a scenario file.

    Example: fbench schema > scenario.schema.json"""
    from framework_bench.scenario.scenario import Scenario
    print(json.dumps(Scenario.model_json_schema(), indent=2))


def pack_cmd(name: Annotated[str, typer.Argument(metavar="NAME", help="scenario name or file")]) -> None:
    """Build (or reuse) the packed data of a scenario; print rows, tokens, documents, sha256.

    Example: fbench pack tiny_cpu_4k"""
    from framework_bench.data.packing import pack
    from framework_bench.run.interrupts import stop_signals_interrupt
    s = common.load_scenario(name)
    try:
        with stop_signals_interrupt():
            data = pack(s, say=lambda msg: common.console.print(f"[yellow]{escape(msg)}[/yellow]", highlight=False))
    except common.user_errors() as e:
        common.fail(str(e))
    except KeyboardInterrupt:
        common.err.print("[yellow]interrupted: nothing was kept of the unfinished packing[/yellow]")
        raise typer.Exit(common.EXIT_INTERRUPTED)
    m = data.manifest
    common.console.print(f"{'reused' if data.cached else 'packed'} {data.dir}", highlight=False, markup=False)
    common.console.print(f"rows {m['rows']:,} x {m['context_length']:,} = {m['tokens']:,} tokens, "
                  f"{m['documents']:,} documents (dataset repeated {m['repeat']}x), {m['seconds']:.2f} s to pack")
    common.console.print(f"sha256 {m['sha256']}")

