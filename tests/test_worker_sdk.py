"""The worker SDK's step timer and rank info, on CPU (the torch-free parts run in the host venv)."""

from __future__ import annotations

import time

from framework_bench.worker import StepTimer, dist_info
from framework_bench.worker.files import read_metrics


def test_step_timer_writes_one_line_per_step_and_excludes_paused_time(tmp_path):
    timer = StepTimer(tmp_path, "cpu", rank=0)
    timer.begin()
    time.sleep(0.05)
    timer.add_tokens(256)
    timer.pause()
    time.sleep(0.3)  # "data loading" between micro-batches: not the step's time
    timer.resume()
    time.sleep(0.05)
    timer.add_tokens(256)
    first = timer.end(step=1, loss=2.5)
    timer.resume()  # no step open: begins one
    timer.end(step=2, loss=None, tokens=7)
    timer.close()

    lines = read_metrics(tmp_path)
    assert [line["step"] for line in lines] == [1, 2]
    assert lines[0]["tokens"] == 512 and lines[1]["tokens"] == 7
    assert 0.1 <= lines[0]["seconds"] < 0.3, lines[0]["seconds"]
    assert lines[0]["loss"] == 2.5 and lines[1]["loss"] is None
    assert lines[0]["peak_mem_bytes"] > 0 and lines[0]["peak_reserved_bytes"] is None  # CPU: max RSS only
    assert first == {k: v for k, v in lines[0].items() if k != "rank"}
    assert timer.steps_written == 2


def test_dist_info_reads_the_launcher_variables(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    alone = dist_info()
    assert (alone.rank, alone.world_size, alone.local_rank, alone.local_world_size) == (0, 1, 0, 1)
    assert alone.is_main and alone.is_local_main
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    d = dist_info()
    assert (d.rank, d.world_size, d.local_rank, d.local_world_size) == (3, 4, 1, 2)
    assert not d.is_main and not d.is_local_main


# --- the typed job, the verified rows, the report writer ------------------------------------------------------------

import json
import multiprocessing
import re
import warnings
from pathlib import Path

import numpy as np
import pydantic
import pytest

from backend_helpers import contributing_backend, tiny
from framework_bench.plugins.contract import Job as HostJob
from framework_bench.worker import Report, StepLog, load_job, publish_once, wait_for, write_report
from framework_bench.worker import packed as packed_format
from framework_bench.worker.files import read_worker_report, write_worker_report
from framework_bench.worker.rows import read_consumed, row_fingerprint

ROOT = Path(__file__).resolve().parents[1]


def packed_folder(directory: Path, rows: int = 6, ctx: int = 8) -> str:
    """A packed folder as the host writes it (arrays + manifest); returns its stream sha256."""
    directory.mkdir(parents=True)
    ids = np.arange(rows * ctx, dtype=np.int32).reshape(rows, ctx) % 250
    labels = ids.copy()
    labels[:, :2] = packed_format.IGNORE_INDEX  # a prompt of two tokens per row
    starts = np.arange(0, rows * ctx, 4, dtype=np.int64)
    for name, array in ((packed_format.INPUT_IDS, ids), (packed_format.LABELS, labels), (packed_format.DOC_STARTS, starts)):
        np.save(directory / name, array)
    (directory / packed_format.MANIFEST).write_text(json.dumps({"context_length": ctx, "rows": rows}))
    return packed_format.stream_sha256(ids, labels, starts)


def host_job(tmp_path: Path, sha: str, **scenario_fields) -> HostJob:
    scn = tiny(context_length=8, **scenario_fields)
    job = HostJob(backend="torch", scenario=scn, data_dir=tmp_path / "packed", data_sha256=sha, run_dir=tmp_path / "run",
                  device="cpu", nprocs=2, settings_mode="native", seed=7)
    job.write()
    return job


def test_typed_job_round_trips_what_the_host_wrote(tmp_path):
    host = host_job(tmp_path, "ab" * 32, grad_accum=3, micro_batch=2, cluster={"device": "cpu", "gpus_per_node": 2},
                    steps={"warmup": 1, "measured": 4})
    job = load_job(host.job_file)
    s = host.scenario
    assert (job.backend, job.run_dir, job.data_dir, job.data_sha256) == ("torch", host.run_dir, host.data_dir, "ab" * 32)
    assert (job.device, job.nprocs, job.nnodes, job.settings_mode, job.seed) == ("cpu", 2, 1, "native", 7)
    assert job.hf_config == host.hf_config
    assert (job.steps, job.micro_batches_per_step, job.data_parallel, job.rows_needed) == \
        (s.steps.total, s.micro_per_step, s.data_parallel, s.rows_needed) == (5, 3, 2, 60)
    sc = job.scenario
    assert (sc.name, sc.context_length, sc.micro_batch, sc.grad_accum, sc.sequence_parallel, sc.zero_stage) == \
        (s.name, 8, 2, 3, 1, 0)
    assert (sc.activation_checkpointing, sc.precision, sc.attention, sc.gpus) == (False, "fp32", "packed", 2)
    assert (sc.steps.warmup, sc.steps.measured, sc.steps.unit) == (1, 4, "optimizer")
    assert (sc.finetune.method, sc.finetune.adapters) == ("full", False)  # left out of a full scenario's dump
    # a worker written against the plain-dict job keeps working
    assert job["scenario"]["steps"]["warmup"] == 1 and job.get("settings_mode") == "native" and job.get("nope") is None


def test_host_and_worker_share_one_definition_of_what_they_exchange():
    """The host's Job, StepMetric and WorkerReport are the worker SDK's dataclasses validated by
    pydantic: the same fields (declared only in the SDK), instances of the SDK's types, and
    the SDK's own checks (bounds) are what the host's validation refuses."""
    from dataclasses import fields

    from framework_bench.plugins import contract as host
    from framework_bench.worker import job as worker_job, report as worker_report

    for ours, theirs in ((host.Job, worker_job.Job), (host.StepMetric, worker_report.StepMetric),
                         (host.WorkerReport, worker_report.WorkerReport)):
        assert issubclass(ours, theirs)
        assert [f.name for f in fields(ours)] == [f.name for f in fields(theirs)]
        # nothing redeclared on the host but the job's scenario: the whole validated one, not the view
        assert set(vars(ours).get("__annotations__", {})) <= {"scenario"}
    assert {f.name for f in fields(worker_report.Claims)} < {f.name for f in fields(host.WorkerReport)}
    assert {f.name for f in fields(worker_report.Claims)} < {f.name for f in fields(worker_report.Report)}
    report = host.WorkerReport.model_validate({"steps": [{"step": 1, "seconds": 0.5, "tokens": 8}]})
    assert type(report.steps[0]) is worker_report.StepMetric
    for bad in ({"step": 0}, {"seconds": float("nan")}, {"tokens": worker_report.MAX_STEP_TOKENS + 1}, {"rank": -1}):
        line = {"step": 1, "seconds": 0.5, "tokens": 8} | bad
        with pytest.raises(ValueError):
            worker_report.StepMetric(**line)
        with pytest.raises(pydantic.ValidationError):
            host.StepMetric.model_validate(line)


def test_derived_quantities_are_worked_out_once_for_host_and_worker(tmp_path):
    """Micro-batches per step, data-parallel size, rows needed and tokens per GPU: the host's
    scenario and the worker's reading of job.json derive them from the same worker SDK class,
    which alone works them out."""
    from framework_bench.scenario.scenario import Scenario, Steps
    from framework_bench.worker import job as worker_job

    host = host_job(tmp_path, "ab" * 32, grad_accum=3, micro_batch=2, sequence_parallel=2,
                    cluster={"device": "cpu", "gpus_per_node": 4}, steps={"warmup": 1, "measured": 4, "unit": "micro"})
    s, read = host.scenario, load_job(host.job_file).scenario
    assert (s.micro_per_step, s.data_parallel, s.rows_needed, s.tokens_per_gpu_step, s.steps.total) == \
        (read.micro_per_step, read.data_parallel, read.rows_needed, read.tokens_per_gpu_step, read.steps.total) == \
        (1, 2, 20, 8, 5)
    assert s.tokens_per_gpu_micro_batch == read.tokens_per_gpu_micro_batch == 2 * 8 // 2
    assert isinstance(s, worker_job.Scenario) and isinstance(read, worker_job.Scenario)
    assert issubclass(Scenario, worker_job.Scenario) and issubclass(Steps, worker_job.Steps)
    sources = {p: p.read_text() for p in [*ROOT.glob("framework_bench/**/*.py"), *ROOT.glob("backends/*/fbench_*/*.py")]}
    worked_out = re.compile(r"context_length\s*//\s*[\w.]*sequence_parallel|\.micro_batch\s*\*\s*[\w.]*context_length")
    assert {str(p.relative_to(ROOT)) for p, text in sources.items() if worked_out.search(text)} == \
        {"framework_bench/worker/job.py"}


def test_the_worker_reads_the_scenario_fields_only_the_host_defines(tmp_path):
    """The scenario's fields are declared and validated by the host's pydantic models alone (the
    worker SDK's classes declare none); a worker reads each one the host dumped, a LoRA
    scenario's resolved adapter settings included."""
    from framework_bench.worker import job as worker_job

    for cls in (worker_job.Scenario, worker_job.Steps, worker_job.FineTune):
        assert not vars(cls).get("__annotations__"), cls
    host = host_job(tmp_path, "ab" * 32, finetune={"method": "lora", "rank": 4, "alpha": 8, "targets": "all-linear"})
    ft, hft = load_job(host.job_file).scenario.finetune, host.scenario.finetune
    assert ft.adapters and hft.adapters
    assert (ft.method, ft.rank, ft.alpha, ft.dropout, ft.targets, ft.base_dtype) == \
        (hft.method, hft.rank, hft.alpha, hft.dropout, hft.targets, hft.base_dtype) == \
        ("lora", 4, 8.0, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], "fp32")


def test_typed_job_tolerates_a_newer_and_an_older_host(tmp_path):
    raw = json.loads(host_job(tmp_path, "ab" * 32).job_file.read_text())
    newer = {**raw, "launcher": "slurm", "scenario": {**raw["scenario"], "new_knob": 3}}
    older = {k: v for k, v in raw.items() if k not in ("seed", "settings_mode", "nnodes")}
    for name, data in (("newer", newer), ("older", older)):
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    assert load_job(tmp_path / "newer.json").scenario.raw["new_knob"] == 3
    old = load_job(tmp_path / "older.json")
    assert (old.seed, old.settings_mode, old.nnodes) == (1024, "matched", 1)  # the host's defaults


def test_rows_other_than_the_hosts_are_refused_and_the_verified_sha_is_reported(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    sha = packed_folder(tmp_path / "packed")
    wrong = load_job(host_job(tmp_path, "0" * 64).job_file)
    with pytest.raises(SystemExit, match=f"packed data in .* has sha256 {sha}, the host expected {'0' * 64}"):
        wrong.open_rows()
    assert wrong.verified_sha256 is None
    job = load_job(host_job(tmp_path, sha).job_file)
    write_report(job, Report(framework_version="1"))
    assert read_worker_report(job.run_dir)["data_sha256"] is None  # nothing verified: nothing claimed
    rows = job.open_rows()
    assert rows.rows == 6 and job.verified_sha256 == sha
    with pytest.raises(SystemExit, match="converted dataset x has sha256"):
        job.check_data("f" * 64, "converted dataset x")
    write_report(job, Report(framework_version="1", settings={"trainer": "t"}, notes=["n"], extra={"rows_converted": 6}))
    report = read_worker_report(job.run_dir)
    assert report == {"data_sha256": sha, "framework_version": "1", "attention_used": None,
                      "settings": {"settings_mode": "native", "trainer": "t"}, "param_count": None,
                      "startup_seconds": None, "startup_breakdown": None, "throughput": {}, "notes": ["n"],
                      "unclaimed": {}, "rows_converted": 6}


def test_only_rank_0_writes_the_report_typed_or_not(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    write_worker_report(tmp_path, data_sha256="x")
    assert not (tmp_path / "worker.json").exists()
    monkeypatch.setenv("RANK", "0")
    write_worker_report(tmp_path, data_sha256="x", notes=[])  # the untyped writer, for older workers
    assert read_worker_report(tmp_path) == {"data_sha256": "x", "notes": []}


def test_batches_are_read_in_order_per_data_parallel_rank(tmp_path):
    sha = packed_folder(tmp_path / "packed", rows=8)
    job = load_job(host_job(tmp_path, sha, grad_accum=2, steps={"warmup": 1, "measured": 1}).job_file)
    rows = job.open_rows()
    firsts = [[int(ids[0, 0]) // 8 for ids, _ in step] for step in job.batches(rows, rank=1, world=2)]
    assert firsts == [[1, 3], [5, 7]]  # micro-batch g of rank r: row g * world + r
    with pytest.raises(SystemExit, match="needs 16 rows, the packed stream has 8"):
        next(job.batches(rows, rank=0, world=4))


def test_step_log_records_every_claim_of_a_plain_loop(tmp_path):
    sha = packed_folder(tmp_path / "packed")
    job = load_job(host_job(tmp_path, sha, grad_accum=2, steps={"warmup": 1, "measured": 2}).job_file)
    log = StepLog(job, rank=0)
    for step, batch in enumerate(job.batches(job.open_rows(), rank=0, world=1), start=1):
        log.begin(step)
        for ids, labels in batch:
            log.micro(ids, labels, 0.5, 10)  # each micro-batch: loss 0.5 over a divisor of 10
        log.end(step)
    log.close()
    lines = [json.loads(line) for line in (job.run_dir / "metrics" / "rank0.jsonl").read_text().splitlines()]
    # the step's token mean: 2 x 0.5 x 10 over the 2 x 6 supervised tokens after the shift
    assert [(m["step"], m["tokens"], m["loss"]) for m in lines] == [(step, 16, pytest.approx(10 / 12)) for step in (1, 2, 3)]
    rows = job.open_rows()
    assert read_consumed(job.run_dir)[0][2] == [row_fingerprint(rows.input_ids[i], rows.labels[i]) for i in (2, 3)]
    assert log.throughput()["tokens_per_sec"] > 0


def _publish(target: str, log: str, barrier, kind: str) -> None:
    def write(tmp: Path) -> None:  # a folder (a converted dataset) or one file (a parquet file)
        with open(log, "a") as fh:
            fh.write(f"{tmp.name}\n")
        if kind == "folder":
            tmp.mkdir()
            time.sleep(0.5)  # a slow writer: the other process must wait, not read half a folder
            (tmp / "done").write_text("complete")
        else:
            tmp.write_text("partial")
            time.sleep(0.5)
            tmp.write_text("complete")

    barrier.wait()
    publish_once(Path(target), write)
    assert (Path(target) / "done" if kind == "folder" else Path(target)).read_text() == "complete"


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_publish_once_one_writer_across_two_processes_the_other_waits(tmp_path, kind):
    """Two nodes sharing a run folder (LLaMA-Factory's tokenized data, XTuner's converted set)."""
    target, log = tmp_path / "converted", tmp_path / "writers.log"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_publish, args=(str(target), str(log), barrier, kind)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    writers = log.read_text().splitlines()
    assert len(writers) == 1 and writers[0].startswith("converted.tmp.")  # pid-unique temp name
    assert not list(tmp_path.glob("converted.tmp.*"))  # published by rename
    assert publish_once(target, lambda tmp: pytest.fail("wrote twice")) is False
    with pytest.raises(SystemExit, match="timed out waiting for .*never"):
        wait_for(tmp_path / "never", seconds=0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from framework_bench.worker.rows import ConsumedRows, read_consumed  # noqa: F401  (its home, no warning)


# --- where the worker-side rules may be broken: nowhere but the SDK ---------------------------------------------------

def worker_side_sources() -> dict[str, str]:
    """Every worker's code: the SDK, the backends' packages (their plugin.py is host side), the
    example worker CONTRIBUTING.md shows, the test fakes' and liars' workers."""
    paths = [*ROOT.glob("framework_bench/worker/*.py"), *ROOT.glob("backends/*/fbench_*/*.py"),
             ROOT / "tests/fake_backends/fbench_fake_worker.py", ROOT / "tests/lying_backends/fbench_lying_worker.py"]
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in paths if p.name != "plugin.py"}
    return sources | {"CONTRIBUTING.md (worker)": contributing_backend()[0]}


def where(pattern: str) -> set[str]:
    return {name for name, text in worker_side_sources().items() if re.search(pattern, text)}


def test_the_data_sha256_is_compared_only_in_the_sdk():
    assert where(r"data_sha256\s*[!=]=|[!=]=\s*[\w.]*data_sha256") == {"framework_bench/worker/job.py"}
    # named at all: by the SDK's job and report writer, and by the fake worker's one lie (it echoes the host's)
    assert where(r"data_sha256") == {"framework_bench/worker/job.py", "framework_bench/worker/report.py",
                                     "tests/fake_backends/fbench_fake_worker.py"}


def test_rank_variables_are_read_only_in_the_sdks_dist_module():
    assert where(r"""["'](LOCAL_)?RANK["']""") == {"framework_bench/worker/dist.py"}


def test_one_seed_constant():
    seeds = r"(?im)^.*seed.*\b1024\b|^.*\b1024\b.*seed"
    assert where(seeds) == {"framework_bench/worker/hparams.py"}
    host = {str(p.relative_to(ROOT)) for p in ROOT.glob("framework_bench/**/*.py") if re.search(seeds, p.read_text())}
    assert host == {"framework_bench/worker/hparams.py"}
