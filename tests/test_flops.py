"""FLOPs accounting: the published table (parsed from the seed file itself), exact model FLOPs, MFU."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from framework_bench.measure import flops
from framework_bench.plugins import registry
from framework_bench.plugins.contract import Job, WorkerReport
from framework_bench.scenario import scenario
from framework_bench.scenario.finetune import FineTune
from framework_bench.scenario.models import PRESETS, ModelArch

SEED = Path(__file__).resolve().parents[1].parent / "shared/seeds/xtuner_speed_benchmark.txt"
MODEL_PREFIX = {"Llama2-7B": "llama2_7b", "Yi-34B-200K": "yi34b", "Llama2-70B": "llama2_70b"}
MODEL_PRESET = {"Llama2-7B": "llama2-7b", "Yi-34B-200K": "yi-34b-200k", "Llama2-70B": "llama2-70b"}
UNIT = {"k": 1024, "M": 1024 * 1024}
PUBLISHED_NAMES = [
    "llama2_7b_8k", "llama2_7b_32k", "llama2_7b_128k", "llama2_7b_256k", "llama2_7b_1m",
    "yi34b_8k", "yi34b_32k", "yi34b_128k", "yi34b_256k",
    "llama2_70b_8k", "llama2_70b_32k", "llama2_70b_128k", "llama2_70b_256k", "llama2_70b_1m",
]


def published_rows() -> list[dict]:
    """The XTuner rows of the seed table, straight from the text (not from our YAML files)."""
    rows = []
    for line in SEED.read_text(encoding="utf-8").splitlines():
        cells = line.strip().split("\t")
        if cells[0] != "XTuner":
            continue
        _, model, gpus, ctx, tgs, tfl, config = cells
        n, unit = re.fullmatch(r"(\d+)([kM])", ctx).groups()
        rows.append({
            "name": f"{MODEL_PREFIX[model]}_{ctx.lower()}",
            "model": model,
            "gpus": int(gpus),
            "context_length": int(n) * UNIT[unit],
            "tgs": float(tgs),
            "tflops": float(tfl),
            "sp": int(re.search(r"_sp(\d+)\.py$", config).group(1)),
            "config": config,
        })
    return rows


ROWS = published_rows()


def test_seed_table_parsed_completely():
    assert [r["name"] for r in ROWS] == PUBLISHED_NAMES


def test_all_published_scenarios_exist():
    names = {p.stem for p in scenario.scenario_paths()}
    assert set(PUBLISHED_NAMES) <= names


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["name"])
def test_published_scenario_matches_table(row):
    s = scenario.load(row["name"])
    assert s.model.preset == MODEL_PRESET[row["model"]]
    assert s.context_length == row["context_length"]
    assert s.sequence_parallel == row["sp"]
    assert s.reference is not None
    assert s.reference.tgs == row["tgs"]
    assert s.reference.tflops == row["tflops"]
    assert s.reference.hardware == "A100-SXM4-80GB"
    assert s.activation_checkpointing
    assert s.cluster.device == "cuda"
    if row["gpus"] % row["sp"] == 0:
        assert s.cluster.gpus == row["gpus"]
    else:
        # Only the 7B-1M row: this copy of the table says 8 GPUs, but SP 16 needs 16 | GPUs;
        # the other copy of the table says 32, which the scenario encodes.
        assert row["name"] == "llama2_7b_1m"
        assert s.cluster.gpus == 32


def test_llama2_7b_1m_is_32_gpus_sp16():
    s = scenario.load("llama2_7b_1m")
    assert (s.cluster.gpus, s.sequence_parallel, s.context_length) == (32, 16, 1048576)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["name"])
def test_published_tflops_recomputed_from_tgs(row):
    """XTuner's formula with recomputation, applied to the published TGS, gives the published TFLOPs (1%)."""
    arch = PRESETS[MODEL_PRESET[row["model"]]]
    per_token = flops.mha_flops_per_token(arch, row["context_length"], recompute=True)
    assert flops.tflops(row["tgs"], per_token) == pytest.approx(row["tflops"], rel=0.01)
    # and through the scenario file (catches a wrong preset/context in the YAML)
    s = scenario.load(row["name"])
    via_yaml = flops.tflops(s.reference.tgs, flops.mha_flops_per_token(s.arch, s.context_length, recompute=True))
    assert via_yaml == pytest.approx(row["tflops"], rel=0.01)


def test_formula_without_recompute_does_not_match_table():
    """The check above can fail: without the recomputation term the cells are off by ~25%."""
    row = ROWS[0]
    arch = PRESETS[MODEL_PRESET[row["model"]]]
    wrong = flops.tflops(row["tgs"], flops.mha_flops_per_token(arch, row["context_length"], recompute=False))
    assert abs(wrong / row["tflops"] - 1) > 0.2


def test_xtuner_formula_by_hand():
    """(3 + ckpt) L (8 h^2 + 4 s h / 2 + 4 r h^2) + 6 h V per token, r = 1.5 I / h."""
    a = PRESETS["llama2-7b"]
    s, h, L, V, I = 8192, 4096, 32, 32000, 11008
    expected = 4 * L * (8 * h * h + 4 * s * h / 2 + 4 * (1.5 * I / h) * h * h) + 6 * h * V
    assert flops.mha_flops_per_token(a, s, recompute=True) == pytest.approx(expected, rel=1e-12)
    # causal halves the attention term
    full = flops.mha_flops_per_token(a, s, recompute=True, causal=False)
    assert full - flops.mha_flops_per_token(a, s, recompute=True) == pytest.approx(4 * L * 4 * s * h / 2)


# ---- exact model FLOPs -------------------------------------------------------------


def layer_forward_by_hand(a: ModelArch, attended: float) -> float:
    h, kv = a.hidden_size, a.num_key_value_heads * (a.hidden_size // a.num_attention_heads)
    q, k, v, o = 2 * h * h, 2 * h * kv, 2 * h * kv, 2 * h * h
    mlp = 3 * 2 * h * a.intermediate_size
    attention = 2 * 2 * attended * h  # QK^T and PV
    return q + k + v + o + mlp + attention


@pytest.mark.parametrize("preset", sorted(p for p, a in PRESETS.items() if not a.family.moe))  # MoE: test_model_families
@pytest.mark.parametrize("recompute", [False, True])
def test_model_flops_by_hand(preset, recompute):
    a, s = PRESETS[preset], 4096
    fwd = layer_forward_by_hand(a, (s + 1) / 2)
    expected = (4 if recompute else 3) * a.num_hidden_layers * fwd + 3 * 2 * a.hidden_size * a.vocab_size
    assert flops.model_flops_per_token(a, s, recompute) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("preset", ["yi-34b-200k", "llama2-70b", "tiny-llama"])
def test_gqa_counted_at_real_size(preset):
    gqa = PRESETS[preset]
    assert gqa.num_key_value_heads < gqa.num_attention_heads
    mha = ModelArch(**{**gqa.model_dump(), "num_key_value_heads": gqa.num_attention_heads})
    h, L = gqa.hidden_size, gqa.num_hidden_layers
    kv_dim = gqa.num_key_value_heads * h // gqa.num_attention_heads
    for recompute in (False, True):
        passes = 4 if recompute else 3
        # K and V projections: 2 matrices x 2 FLOPs per MAC x h x (h - kv_dim) fewer, per layer and pass
        diff = passes * L * 2 * 2 * h * (h - kv_dim)
        got = flops.model_flops_per_token(mha, 8192, recompute) - flops.model_flops_per_token(gqa, 8192, recompute)
        assert got == pytest.approx(diff, rel=1e-12)
        assert diff > 0
    # the XTuner formula ignores KV heads (it over-counts GQA)
    assert flops.mha_flops_per_token(gqa, 8192, True) == flops.mha_flops_per_token(mha, 8192, True)


def test_mha_model_has_no_gqa_difference():
    a = PRESETS["llama2-7b"]
    same = ModelArch(**a.model_dump())
    assert flops.model_flops_per_token(a, 4096, True) == flops.model_flops_per_token(same, 4096, True)


@pytest.mark.parametrize("s", [1, 2, 7, 64])
def test_causal_mean_attended_is_exact(s):
    """The default mean of keys per query equals the causal mask's own mean."""
    mean_causal = np.tril(np.ones((s, s))).sum(axis=1).mean()
    a = PRESETS["tiny-llama"]
    assert flops.model_flops_per_token(a, s, False) == pytest.approx(
        flops.model_flops_per_token(a, s, False, mean_attended=mean_causal), rel=1e-12)


def test_causal_attention_is_half_of_full():
    a, s = PRESETS["llama2-7b"], 131072
    none = flops.model_flops_per_token(a, s, True, mean_attended=0)
    causal = flops.model_flops_per_token(a, s, True) - none
    full = flops.model_flops_per_token(a, s, True, mean_attended=s) - none
    assert causal / full == pytest.approx(0.5, rel=1e-4)
    assert causal == pytest.approx(4 * a.num_hidden_layers * 4 * a.hidden_size * (s + 1) / 2)


@pytest.mark.parametrize("preset", sorted(p for p, a in PRESETS.items() if not a.family.moe))  # MoE: test_model_families
def test_recompute_adds_one_forward_of_the_layers(preset):
    a, s = PRESETS[preset], 2048
    diff = flops.model_flops_per_token(a, s, True) - flops.model_flops_per_token(a, s, False)
    assert diff == pytest.approx(a.num_hidden_layers * layer_forward_by_hand(a, (s + 1) / 2), rel=1e-12)
    # the LM head is not recomputed
    head = 6 * a.hidden_size * a.vocab_size
    assert flops.model_flops_per_token(a, s, False) - head == pytest.approx(3 * diff, rel=1e-12)


@pytest.mark.parametrize("preset,params", [
    # published parameter counts (HF checkpoints), minus input embedding and RMSNorm weights:
    # what remains are the matmul weights, each costing 6 FLOPs per token for training.
    ("llama2-7b", 6_738_415_616 - 32000 * 4096 - (2 * 32 + 1) * 4096),
    ("llama2-70b", 68_976_648_192 - 32000 * 8192 - (2 * 80 + 1) * 8192),
])
def test_model_flops_is_6n_without_attention(preset, params):
    assert flops.model_flops_per_token(PRESETS[preset], 1, False, mean_attended=0) == 6 * params


def test_varlen_attention_counts_fewer_flops():
    a = PRESETS["llama2-7b"]
    assert flops.model_flops_per_token(a, 8192, True, mean_attended=200) < flops.model_flops_per_token(a, 8192, True)


def test_model_flops_below_xtuner_for_gqa_published_cell():
    """Yi-34B 128k: the XTuner formula over-counts GQA, so the model-FLOPs TFLOPs is lower."""
    s = scenario.load("yi34b_128k")
    xt = flops.tflops(s.reference.tgs, flops.mha_flops_per_token(s.arch, s.context_length, True))
    model = flops.tflops(s.reference.tgs, flops.model_flops_per_token(s.arch, s.context_length, True))
    assert model < xt
    assert xt == pytest.approx(191.8, rel=0.01)


# ---- MFU ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name,peak", [
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100 80GB PCIe", 312.0),
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H200", 989.0), ("nvidia h200 nvl", 989.0),
    ("Tesla V100-SXM2-32GB", None), ("", None), (None, None),
])
def test_gpu_peak_table(name, peak):
    assert flops.gpu_peak_tflops(name) == peak


def test_mfu():
    assert flops.mfu(156.0, flops.gpu_peak_tflops("NVIDIA A100-SXM4-80GB")) == pytest.approx(0.5)
    assert flops.mfu(494.5, flops.gpu_peak_tflops("NVIDIA H200")) == pytest.approx(0.5)
    assert flops.mfu(100.0, 400.0) == pytest.approx(0.25)  # a user-given peak
    assert flops.mfu(100.0, None) is None


def test_mfu_of_published_cell_on_a100():
    s = scenario.load("llama2_7b_32k")
    model_tflops = flops.tflops(s.reference.tgs, flops.model_flops_per_token(s.arch, s.context_length, True))
    mfu = flops.mfu(model_tflops, flops.gpu_peak_tflops(s.reference.hardware))
    assert 0.5 < mfu < 0.7  # ~193 TFLOPs of 312


# ---- The CPU ceiling (framework_bench/measure/cpu_peak.py) -----------------------------------

from backend_helpers import tiny  # noqa: E402

from framework_bench.measure import cpu_peak, metrics  # noqa: E402
from framework_bench.plugins.contract import StepMetric  # noqa: E402

XEON_AMX = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
cpu MHz\t\t: 2000.000
flags\t\t: fpu sse sse2 avx fma avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse sse2
"""
DESKTOP_AVX2 = """processor\t: 0
model name\t: Intel(R) Core(TM) i7-6700 CPU @ 3.40GHz
cpu MHz\t\t: 800.021
flags\t\t: fpu sse sse2 ssse3 fma avx avx2
"""
GRAVITON3 = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm sve bf16 i8mm
CPU implementer\t: 0x41
CPU part\t: 0xd40
"""


def fake_machine(root, cpuinfo: str | None, max_khz: int | None = None, driver: str = "intel_pstate",
                 boost: bool = False, cpuset: str | None = None):
    """A /proc and /sys of a machine, as `cpu_peak.read` reads them."""
    proc, sysfs = root / "proc", root / "sys"
    (proc / "self").mkdir(parents=True)
    if cpuinfo is not None:
        (proc / "cpuinfo").write_text(cpuinfo)
    if max_khz:
        for i in range(2):
            freq = sysfs / f"devices/system/cpu/cpu{i}/cpufreq"
            freq.mkdir(parents=True)
            (freq / "cpuinfo_max_freq").write_text(f"{max_khz - 1000 * i}\n")
            (freq / "scaling_driver").write_text(driver + "\n")
        if boost:
            (sysfs / "devices/system/cpu/cpufreq").mkdir()
            (sysfs / "devices/system/cpu/cpufreq/boost").write_text("1\n")
    if cpuset is not None:
        (proc / "self/cgroup").write_text("0::/fbench.slice\n")
        (sysfs / "fs/cgroup/fbench.slice").mkdir(parents=True)
        (sysfs / "fs/cgroup/fbench.slice/cpuset.cpus.effective").write_text(cpuset + "\n")
    return proc, sysfs


def test_cpu_peak_of_an_avx512_amx_xeon_counts_its_cpuset_at_its_turbo_clock(tmp_path):
    peak = cpu_peak.read(*fake_machine(tmp_path, XEON_AMX, max_khz=3_800_000, cpuset="0-3,8-11"))
    assert peak.model == "Intel(R) Xeon(R) Platinum 8480+" and peak.cpus == max(8, len(os.sched_getaffinity(0)))
    assert peak.ghz == 3.8 and peak.clock_source == "cpuinfo_max_freq"
    assert (peak.fp32_flops_per_cycle, peak.bf16_flops_per_cycle) == (64, 1024)  # 16 lanes x 2 FMA x 2; AMX
    assert peak.tflops("fp32") == pytest.approx(peak.cpus * 3.8 * 64 / 1000)
    assert peak.tflops("bf16") == pytest.approx(16 * peak.tflops("fp32"))
    assert "avx512f: 16 fp32 lanes x 2 FMA units x 2" in peak.describe("fp32")


def test_cpu_peak_of_an_avx2_desktop_whose_boost_clock_is_hidden_assumes_the_fastest_shipped(tmp_path):
    # acpi-cpufreq with boost reports base + 1 MHz: not the clock the cores reach
    peak = cpu_peak.read(*fake_machine(tmp_path, DESKTOP_AVX2, max_khz=3_401_000, driver="acpi-cpufreq", boost=True))
    assert peak.cpus == len(os.sched_getaffinity(0))
    assert peak.ghz == cpu_peak.MAX_SHIPPED_GHZ and "acpi-cpufreq hides the boost clock" in peak.clock_source
    assert (peak.fp32_flops_per_cycle, peak.bf16_flops_per_cycle) == (32, 32)  # bf16 computed in fp32


def test_cpu_peak_of_an_arm_vm_without_cpufreq(tmp_path):
    peak = cpu_peak.read(*fake_machine(tmp_path, GRAVITON3))
    assert peak.model == "Arm CPU part 0xd40"
    assert peak.ghz == cpu_peak.MAX_SHIPPED_GHZ and peak.clock_source.startswith("no cpufreq")
    assert (peak.fp32_flops_per_cycle, peak.bf16_flops_per_cycle) == (64, 256)  # SVE at 512 bits x 2 pipes; BFMMLA x4
    no_sve = cpu_peak.read(*fake_machine(tmp_path / "neon", GRAVITON3.replace(" sve bf16", "")))
    assert (no_sve.fp32_flops_per_cycle, no_sve.bf16_flops_per_cycle) == (32, 32)  # 4 lanes x 4 pipes x 2


def test_a_cpu_whose_peak_cannot_be_read_says_why(tmp_path):
    assert "cpuinfo cannot be read" in cpu_peak.read(*fake_machine(tmp_path / "a", None))
    assert "SME" in cpu_peak.read(*fake_machine(tmp_path / "b", GRAVITON3.replace("bf16", "bf16 sme")))
    assert "neither x86 flags nor Arm features" in cpu_peak.read(*fake_machine(tmp_path / "c", "processor\t: 0\n"))


def test_cpu_list_size():
    assert [cpu_peak.cpu_list_size(t) for t in ("0", "0-1", "0-3,8,10-11\n", "")] == [1, 2, 7, 0]


def _steps(seconds: float, tokens: int = 512) -> list[StepMetric]:
    return [StepMetric(step=i, seconds=seconds, tokens=tokens) for i in range(1, 8)]


def test_cpu_figures_above_the_machines_peak_are_impossible_and_name_it(tmp_path):
    s = tiny(cluster={"device": "cpu", "gpus_per_node": 2}, steps={"warmup": 2, "measured": 5})
    peak = cpu_peak.read(*fake_machine(tmp_path, DESKTOP_AVX2, max_khz=4_000_000, cpuset="0-1"))
    per_token = flops.model_flops_per_token(s.arch, s.context_length, False)
    # 2 processes x TGS x FLOPs per token against CPUs x 4 GHz x 32 FLOPs/cycle (avx2)
    assert peak.tflops("fp32") == pytest.approx(peak.cpus * 4.0 * 32 / 1000)
    limit = peak.tflops("fp32") * 1e12 / per_token / 2
    below = metrics.figures(s, _steps(512 / (0.99 * limit)), None, cpu=peak)
    assert "impossible" not in below and below["mfu"] is None and not below["flags"]
    above = metrics.figures(s, _steps(512 / (1.01 * limit)), None, cpu=peak)
    assert above.get("tgs") is None and above.get("model_tflops") is None
    assert "above the peak of the CPU that ran it" in above["impossible"]
    assert "(2 processes x " in above["impossible"] and peak.describe("fp32") in above["impossible"]


def test_a_cpu_run_without_a_ceiling_keeps_its_figures_and_flags_why():
    out = metrics.figures(scenario.load("tiny_cpu"), _steps(1e-4), None, cpu="/proc/cpuinfo cannot be read")
    assert out["tgs"] == pytest.approx(512 / 1e-4)
    assert "no CPU ceiling: /proc/cpuinfo cannot be read" in out["flags"]


def test_a_gpu_not_in_the_table_is_flagged_not_passed_silently():
    s = tiny(cluster={"device": "cuda"})
    assert "no GPU ceiling: Tesla V100-SXM2-32GB is not in the GPU table" in " ".join(
        metrics.figures(s, _steps(0.5), None, "Tesla V100-SXM2-32GB")["flags"])
    assert "no GPU ceiling: the GPU's name is unknown" in metrics.figures(s, _steps(0.5), None)["flags"]
    assert not metrics.figures(s, _steps(0.5), flops.gpu_peak_tflops("NVIDIA H100"), "NVIDIA H100")["flags"]


def test_this_machines_cpu_peak_is_read():
    peak = cpu_peak.this_machine()
    assert isinstance(peak, cpu_peak.CpuPeak), peak
    assert peak.cpus >= len(os.sched_getaffinity(0)) and peak.tflops("fp32") > 0


def test_a_plugin_claiming_5ms_steps_on_tiny_cpu_gets_the_hosts_figure_and_fails_the_clock(fakes, tmp_path):
    """It spins 50 ms a step and claims 5 ms, figures above this CPU's peak: the figures are never
    better than the host's windows, so its TGS is the host's (under the ceiling), and the claim
    fails the clock check. A step the host saw as short (a model that never runs) still meets
    the ceiling: tests/test_model_lies.py."""
    from framework_bench.measure import metrics
    from framework_bench.run import pipeline
    from framework_bench.run.options import RunOptions

    tiny = scenario.load("tiny_cpu")
    result = pipeline.run_one("fake_too_fast", tiny, RunOptions(root=tmp_path / "runs"))
    assert result.status == "invalid", (result.status, result.reason)
    assert result.reason.startswith("clock check failed"), result.reason
    assert 0 < result.tgs < tiny.context_length / 0.04  # the host saw each step take its 50 ms
    job = Job.model_validate_json((result.run_dir / "job.json").read_text())
    claims = WorkerReport.model_validate(registry.get("fake_too_fast").read_report(job)).steps
    claimed = metrics.figures(tiny, claims, None)
    assert "above the peak of the CPU that ran it" in claimed["impossible"]  # what its claims alone would give


# ---------------------------------------------------------------------------------------
# LoRA / QLoRA: a frozen base with adapters

# hidden 8, 1 layer, 2 heads of 4, 1 KV head (kv width 4), intermediate 16, vocab 10
HAND = ModelArch(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                 intermediate_size=16, vocab_size=10, rope_theta=10000.0, max_position_embeddings=64)


def test_lora_flops_per_token_against_a_hand_count():
    ft = FineTune(method="lora", rank=2, alpha=4, targets=["q_proj", "down_proj"])
    # base linears: q 8x8 + k 8x4 + v 8x4 + o 8x8 + gate, up 8x16 + down 16x8 = 64+32+32+64+3*128 = 576 weights
    # adapters: q 2*(8+8) = 32, down 2*(16+8) = 48: 80 weights
    # attention forward over a row of 3 (mean attended (3+1)/2 = 2): 2 * 2 * 2 * 8 = 64; head 8 x 10 = 80
    # frozen base: forward 2N + activation gradient 2N; adapters 6n; attention 3x; head forward + dx: 4hV
    no_recompute = 4 * 576 + 6 * 80 + 3 * 64 + 4 * 80
    assert no_recompute == 3296
    assert flops.lora_flops_per_token(HAND, 3, recompute=False, finetune=ft) == no_recompute
    # recomputation runs the forward once more: + 2N + 2n + attention
    assert flops.lora_flops_per_token(HAND, 3, recompute=True, finetune=ft) == no_recompute + 2 * 576 + 2 * 80 + 64
    # full fine-tuning of the same model: 6N + 3x attention + 6hV; the difference is the frozen
    # weights' dW GEMMs (2N, 2hV) less the adapters' 6n
    full = flops.model_flops_per_token(HAND, 3, recompute=False)
    assert full == 6 * 576 + 3 * 64 + 6 * 80
    assert full - no_recompute == 2 * 576 + 2 * 80 - 6 * 80


def test_scenario_flops_follow_the_method():
    full, lora = scenario.load("llama2_7b_8k_1gpu"), scenario.load("llama2_7b_8k_1gpu_lora")
    assert flops.scenario_model_flops_per_token(full) == flops.model_flops_per_token(full.arch, 8192, True)
    assert flops.scenario_model_flops_per_token(lora) == flops.lora_flops_per_token(lora.arch, 8192, True,
                                                                                     lora.finetune)
    # about 4N instead of 6N on the linears, the attention unchanged: between two thirds and all of full
    assert 2 / 3 < flops.scenario_model_flops_per_token(lora) / flops.scenario_model_flops_per_token(full) < 1
    # the XTuner-formula figure knows nothing of adapters: the same for both
    assert flops.mha_flops_per_token(full.arch, 8192, True) == flops.mha_flops_per_token(lora.arch, 8192, True)
