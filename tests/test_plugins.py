"""The plugin host: backends come only from the `fbench.backends` entry-point group.

A throwaway third-party backend is "installed" the way pip would leave it: a
`*.dist-info` folder with `entry_points.txt` on sys.path, next to its module.
"""

from __future__ import annotations

import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from typer.testing import CliRunner

from framework_bench.plugins import hookspecs
from framework_bench.plugins import registry as plugins
from framework_bench.scenario import scenario
from framework_bench.plugins.contract import BackendEnv, Job, LaunchPlan, Machine, WorkerReport
from framework_bench.cli import app
from framework_bench.run import design

FAKE_MODULE = '''
"""A third-party fbench backend living in another package."""
from pathlib import Path

from framework_bench.plugins.contract import BackendInfo, Capabilities, EnvSpec, LaunchPlan, StepMetric, WorkerReport
from framework_bench.plugins.hookspecs import hookimpl

HERE = Path(__file__).resolve().parent
calls = []


@hookimpl
def fbench_backend_info():
    calls.append("info")
    return BackendInfo(
        name="{name}", framework="FakeFrame", description="a throwaway test backend",
        capabilities=Capabilities(cpu=True, gpu=False, sequence_parallel=False, varlen=True, zero_stages=[0]),
        env=EnvSpec(requirements={{"cpu": HERE / "fake-requirements.txt"}}, framework_package="fakeframe"),
    )


@hookimpl
def fbench_check(scenario, machine, env):
    calls.append("check")
    if scenario.cluster.device != "cpu":
        return f"{name} runs on CPU only; {{scenario.name}} wants {{scenario.cluster.device}}"
    return None


@hookimpl
def fbench_plan(job, env):
    calls.append("plan")
    cfg = job.run_dir / "fake.cfg"
    cfg.write_text(f"context={{job.scenario.context_length}}\\n")
    return LaunchPlan(python=env.python, module="{name}_worker", args=["--job", str(job.job_file)],
                      env={{"FAKE": "1"}}, files={{"config": cfg}})


@hookimpl
def fbench_read_report(job):
    calls.append("read_report")
    return WorkerReport(steps=[StepMetric(step=1, seconds=0.5, tokens=512, loss=9.0)],
                        data_sha256=job.data_sha256, framework_version="0.0.1")
'''


def install_dist(site: Path, dist: str, entry_name: str, module: str, source: str) -> None:
    """What `pip install` leaves behind for a package declaring one fbench backend
    (`module`, or `module:Object` naming an object in it)."""
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{hookspecs.ENTRY_POINT_GROUP}]\n{entry_name} = {module}\n")
    (site / f"{module.partition(':')[0]}.py").write_text(source)


@pytest.fixture
def site(tmp_path, monkeypatch, fbench_home):
    """A fresh site dir on sys.path; modules imported from it are forgotten afterwards."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(plugins, "load_errors", {})
    before = set(sys.modules)
    yield site
    for name in set(sys.modules) - before:
        if getattr(sys.modules[name], "__file__", None) and str(site) in sys.modules[name].__file__:
            del sys.modules[name]


@pytest.fixture
def fake(site):
    install_dist(site, "fake_backend", "fake", "fake_backend_mod", textwrap.dedent(FAKE_MODULE.format(name="fake")))
    (site / "fake-requirements.txt").write_text("fakeframe==0.0.1\n")
    return site


def test_bundled_backends_come_from_entry_points():
    group = {ep.name: ep.value for ep in entry_points(group=hookspecs.ENTRY_POINT_GROUP)}
    assert group.get("xtuner") == "fbench_xtuner.plugin:XTunerBackend"
    assert group.get("llamafactory") == "fbench_llamafactory.plugin:LlamaFactoryBackend"
    pm = plugins.manager()
    registered = {name for name, _ in pm.list_name_plugin()}
    assert {"xtuner", "llamafactory"} <= registered
    # nothing registered by hand: every plugin is an entry point of the group
    assert registered <= set(group)
    found = plugins.backends(pm)
    assert {"xtuner", "llamafactory"} <= set(found)
    for name in ("xtuner", "llamafactory"):
        assert found[name].info.name == name
        plugin = pm.get_plugin(name)  # the entry point's Backend subclass, registered as its one instance
        assert f"{type(plugin).__module__}:{type(plugin).__name__}" == group[name]


def test_hookspecs_are_firstresult_and_documented():
    for hook in ("fbench_backend_info", "fbench_check", "fbench_plan", "fbench_read_report"):
        fn = getattr(hookspecs.TrainBackend, hook)
        assert fn.__doc__ and len(fn.__doc__.split()) > 10, hook
        assert getattr(fn, "fbench_spec")["firstresult"] is True, hook


def test_third_party_backend_registered_through_entry_point(fake, tmp_path):
    assert "fake" in {ep.name for ep in entry_points(group=hookspecs.ENTRY_POINT_GROUP)}
    found = plugins.backends()
    assert {"fake", "xtuner", "llamafactory"} <= set(found)
    b = found["fake"]
    mod = sys.modules["fake_backend_mod"]
    assert mod.__file__ == str(fake / "fake_backend_mod.py")

    info = b.info
    assert (info.name, info.framework, info.env.framework_package) == ("fake", "FakeFrame", "fakeframe")
    assert info.capabilities.cpu and not info.capabilities.gpu and info.capabilities.varlen

    env = BackendEnv(name="fake", path=tmp_path / "env", python=tmp_path / "env/bin/python")
    cpu, gpu = scenario.load("tiny_cpu"), scenario.load("yi34b_128k")
    assert b.check(cpu, Machine(), env) is None
    assert b.check(gpu, Machine(), env) == "fake runs on CPU only; yi34b_128k wants cuda"

    job = Job(backend="fake", scenario=cpu, data_dir=tmp_path / "data", data_sha256="ab" * 32,
              run_dir=tmp_path / "run", device="cpu")
    job.write()
    plan = b.plan(job, env)
    assert isinstance(plan, LaunchPlan)
    assert plan.module == "fake_worker" and plan.args == ["--job", str(job.job_file)] and plan.env == {"FAKE": "1"}
    assert plan.files["config"].read_text() == "context=512\n"

    report = b.read_report(job)
    assert isinstance(report, WorkerReport)
    assert report.data_sha256 == "ab" * 32 and report.steps[0].tokens == 512
    assert mod.calls == ["info", "check", "check", "plan", "read_report"]

    assert plugins.get("fake").info.name == "fake"
    with pytest.raises(plugins.UnknownBackend, match="no backend named 'nope'"):
        plugins.get("nope")


def test_hooks_reach_only_their_own_backend(site):
    """Two third-party backends: each RegisteredBackend calls its own plugin's hooks, never the other's."""
    for name in ("fake_a", "fake_b"):
        install_dist(site, name, name, f"{name}_mod", textwrap.dedent(FAKE_MODULE.format(name=name)))
    found = plugins.backends()
    gpu = scenario.load("yi34b_128k")
    env = BackendEnv(name="x", path=site, python=site / "python")
    assert found["fake_a"].check(gpu, Machine(), env).startswith("fake_a runs")
    assert found["fake_b"].check(gpu, Machine(), env).startswith("fake_b runs")
    assert sys.modules["fake_a_mod"].calls.count("check") == 1
    assert sys.modules["fake_b_mod"].calls.count("check") == 1


def test_cli_backends_lists_third_party(fake):
    result = CliRunner().invoke(app, ["backends"])
    assert result.exit_code == 0, result.output
    lines = [l for l in result.output.splitlines() if " fake " in f" {l} " or "│ fake" in l]
    assert lines, result.output
    out = result.output
    for name in ("fake", "xtuner", "llamafactory"):
        assert name in out
    assert "not created" in " ".join(out.split())  # FBENCH_HOME is a fresh tmp dir: no envs yet


def test_broken_plugin_reported_and_others_still_load(fake, site):
    install_dist(site, "broken_backend", "broken", "broken_backend_mod",
                 "raise RuntimeError('this backend is broken on purpose')\n")
    install_dist(site, "missing_backend", "missing", "no_such_module_anywhere", "")
    (site / "no_such_module_anywhere.py").unlink()
    found = plugins.backends()
    assert {"fake", "xtuner", "llamafactory"} <= set(found)
    assert "broken" not in found and "missing" not in found
    assert plugins.load_errors["broken"] == "RuntimeError: this backend is broken on purpose"
    assert plugins.load_errors["missing"].startswith("ModuleNotFoundError")
    result = CliRunner().invoke(app, ["backends"])
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert "broken" in flat and "failed to load" in flat and "Traceback" not in result.output


# --- the hard contract: broken plugins, failing hooks, notes, job.json, capabilities ---------

PROBE_MODULE = '''
"""A third-party backend whose hooks misbehave as MODE says; its worker does nothing."""
import sys
from pathlib import Path

from framework_bench.plugins.contract import BackendInfo, Capabilities, EnvSpec, LaunchPlan, StepMetric, WorkerReport
from framework_bench.plugins.hookspecs import hookimpl

HERE = Path(__file__).resolve().parent
MODE = "{mode}"


@hookimpl
def fbench_backend_info():
    if MODE == "info":
        raise RuntimeError("no info today")
    return BackendInfo(name="probe_{mode}", framework="Probe",
                       capabilities=Capabilities(cpu=True, gpu=False, sequence_parallel=False, varlen=False),
                       env=EnvSpec(requirements={{"cpu": HERE / "probe-requirements.txt"}}, framework_package="probe"))


@hookimpl
def fbench_check(scenario, machine, env):
    if MODE == "check":
        raise ValueError("check fell over")
    return None


@hookimpl
def fbench_plan(job, env):
    if MODE == "plan":
        raise ValueError("no plan for " + job.scenario.name)
    job.job_file.write_text("{{}}")  # a plan must not touch job.json: the host rewrites it
    return LaunchPlan(python=Path(sys.executable), module="probe_noop_worker", env={{"PYTHONPATH": str(HERE)}})


@hookimpl
def fbench_read_report(job):
    if MODE == "report":
        return {{}}["steps"]
    steps = [StepMetric(step=s, seconds=0.5, tokens=512, loss=1.0) for s in range(1, job.scenario.steps.total + 1)]
    return WorkerReport(steps=steps, data_sha256=job.data_sha256, framework_version="1",
                        notes=["the probe trained nothing", "[red]not markup[/red]"])
'''


@pytest.fixture
def probes(site):
    for mode in ("ok", "info", "check", "plan", "report"):
        install_dist(site, f"probe_{mode}", f"probe_{mode}", f"probe_{mode}_mod",
                     textwrap.dedent(PROBE_MODULE.format(mode=mode)))
    (site / "probe-requirements.txt").write_text("probe==1\n")
    (site / "probe_noop_worker.py").write_text("")
    return site


def test_a_plugin_missing_hooks_is_listed_broken_and_run_says_why(site):
    install_dist(site, "half_backend", "half", "half_backend_mod", textwrap.dedent('''
        from framework_bench.plugins.hookspecs import hookimpl

        @hookimpl
        def fbench_check(scenario, machine, env):
            return None
    '''))
    found = plugins.backends()
    assert "half" not in found and {"xtuner", "llamafactory"} <= set(found)
    assert plugins.load_errors["half"] == "missing hooks fbench_backend_info, fbench_plan, fbench_read_report"
    res = CliRunner().invoke(app, ["run", "--backend", "half", "--scenario", "tiny_cpu"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    flat = " ".join(res.output.split())
    assert "the backend 'half' is installed but broken: missing hooks fbench_backend_info" in flat
    listed = " ".join(CliRunner().invoke(app, ["backends"]).output.split())
    assert "half" in listed and "failed to load: missing hooks" in listed
    for argv in (["env", "create", "half"], ["compare", "--scenario", "tiny_cpu", "--backends", "half"]):
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == 1 and "Traceback" not in res.output, res.output
        assert "'half' is installed but broken: missing hooks" in " ".join(res.output.split())


def test_backend_info_raising_is_a_broken_plugin(probes):
    found = plugins.backends()
    assert "probe_ok" in found and not any(name.startswith("probe_info") for name in found)
    assert plugins.load_errors["probe_info"] == "RuntimeError: no info today"
    with pytest.raises(plugins.UnknownBackend, match="probe_info' is installed but broken: RuntimeError"):
        plugins.get("probe_info")


@pytest.mark.parametrize("mode, says", [
    ("check", "fbench_check raised ValueError: check fell over"),
    ("plan", "fbench_plan raised ValueError: no plan for tiny_cpu"),
    ("report", "fbench_read_report raised KeyError: 'steps'"),
])
def test_a_raising_hook_is_a_failed_row_with_its_traceback(probes, tmp_path, mode, says):
    from framework_bench.run import pipeline
    from framework_bench.run.options import RunOptions
    from framework_bench.store.results import ResultStore

    s = scenario.load("tiny_cpu")
    r = pipeline.run_one(f"probe_{mode}", s, RunOptions(root=tmp_path / "runs"), machine=Machine())
    assert r.status == "failed" and r.reason.startswith(says), r.reason
    assert "Traceback (most recent call last)" in r.reason and f"probe_{mode}_mod.py" in r.reason
    assert "pluggy" not in r.reason and "pipeline.py" not in r.reason  # the plugin's frames, not the host's
    with ResultStore(tmp_path / "r.sqlite") as store:  # the row is stored like any other
        assert store.get(store.add(r, s))["reason"] == r.reason


def test_notes_are_kept_stored_shown_and_job_json_is_the_hosts(probes, tmp_path):
    db = tmp_path / "r.sqlite"
    res = CliRunner().invoke(app, ["run", "--backend", "probe_ok", "--scenario", "tiny_cpu", "--db", str(db),
                                   "--no-reference"])
    assert res.exit_code == 0, res.output
    assert "note: the probe trained nothing" in res.output and "note: [red]not markup[/red]" in res.output
    from framework_bench.store.results import ResultStore

    with ResultStore(db) as store:
        row = store.list()[0]
        # a contract-1 probe that makes no claim: its run `unverified`, never invalid; its notes kept alike
        assert row["status"] == "unverified" and row["notes"][:2] == ["the probe trained nothing", "[red]not markup[/red]"]
        assert row["notes"][2:] == [design.older_plugin_note(["probe_ok"])]  # contract 1: every run from the seed
        job = Job.model_validate_json((Path(row["run_dir"]) / "job.json").read_text())
    assert job.backend == "probe_ok" and job.scenario.name == "tiny_cpu"  # not the plan's "{}"


def test_dry_run_shows_the_verdict_then_the_plan_error(probes):
    res = CliRunner().invoke(app, ["run", "--backend", "probe_plan", "--scenario", "tiny_cpu", "--dry-run"])
    assert res.exit_code == 0 and "Traceback (most" in res.output  # the plugin's traceback, shown as text
    flat = " ".join(res.output.split())
    verdict, error = flat.index("probe_plan via local: checks pass on this machine"), flat.index("no plan: fbench_plan raised")
    assert verdict < error


def test_declared_capabilities_are_enforced_by_the_host(fake):
    from framework_bench.run import refusals

    gpu_tiny = scenario.load("tiny_cpu").model_copy(update={"cluster": scenario.Cluster(device="cuda")})
    _, verdict = refusals.refusals_for(plugins.get("fake"), gpu_tiny, Machine(gpus=1, gpu_name="H100", gpu_memory_gib=80))
    assert verdict.reason == "fake: the fake backend declares no GPU support; the scenario runs on CUDA GPUs"
    assert sys.modules["fake_backend_mod"].calls.count("check") == 0  # refused before the plugin was asked


# ---------------------------------------------------------------------------------------
# Name collisions: every claimant broken, both named, none runs.


@pytest.fixture
def fake_dists(tmp_path, monkeypatch):
    """The fake backends' module importable, and a way to install entry points as any distribution."""
    fakes_dir = Path(__file__).parent / "fake_backends"
    monkeypatch.syspath_prepend(str(fakes_dir))
    import fbench_fake_backends
    site = tmp_path / "site"
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(plugins, "load_errors", {})
    return lambda dist, eps: fbench_fake_backends.register_through_entry_points(site, eps, dist)


def test_an_entry_point_taking_the_bundled_torch_name_breaks_both(fake_dists):
    fake_dists("sneaky-torch", {"torch": "fbench_fake_backends:ok"})
    assert "torch" not in plugins.backends()
    why = plugins.load_errors["torch"]
    assert "sneaky-torch" in why and "fbench-torch" in why and "none of them runs" in why
    with pytest.raises(plugins.UnknownBackend, match="sneaky-torch"):
        plugins.get("torch")
    listed = CliRunner().invoke(app, ["backends"]).stdout
    assert "sneaky-torch" in listed


def test_two_plugins_giving_one_backend_name_are_both_broken(fake_dists):
    fake_dists("fbench-twins", {"fake_twin_a": "fbench_fake_backends:twin_a", "fake_twin_b": "fbench_fake_backends:twin_b"})
    assert "fake_twin" not in plugins.backends()
    why = plugins.load_errors["fake_twin"]
    assert "fake_twin_a" in why and "fake_twin_b" in why and "fbench-twins" in why


def test_compare_without_backends_names_the_broken_ones_it_skips(fake_dists, fbench_home, tmp_path):
    fake_dists("fbench-twins", {"fake_twin_a": "fbench_fake_backends:twin_a", "fake_twin_b": "fbench_fake_backends:twin_b"})
    res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--dry-run"])
    assert res.exit_code == 0, res.output
    skipped = [l for l in res.stderr.splitlines() if l.startswith("skipped")]
    assert len(skipped) == 1 and "fake_twin" in skipped[0], res.stderr


# ---------------------------------------------------------------------------------------
# The Backend base class: a subclass writes only what is its own.

SUBCLASS_MODULE = '''
"""A third-party backend on the base class: info and one refusal of its own, nothing else."""
from pathlib import Path

from framework_bench.plugins.contract import BackendInfo, Capabilities, EnvSpec
from framework_bench.plugins.base import Backend

HERE = Path(__file__).resolve().parent


class SubBackend(Backend):
    def info(self):
        return BackendInfo(name="sub", framework="SubFrame",
                           capabilities=Capabilities(cpu=True, gpu=True, sequence_parallel=False, varlen=False),
                           env=EnvSpec(requirements={"cpu": HERE / "sub-requirements.txt"}, framework_package="subframe"))

    def check(self, scenario, machine, env):
        if scenario.grad_accum > 1:
            return "sub takes one micro-batch per step"
        return super().check(scenario, machine, env)
'''


@pytest.fixture
def sub(site):
    install_dist(site, "sub_backend", "sub", "sub_backend_mod:SubBackend", textwrap.dedent(SUBCLASS_MODULE))
    return plugins.get("sub")


def test_a_backend_subclass_is_registered_through_its_entry_point_with_every_hook(sub):
    from framework_bench.plugins.base import SUBCLASS_CONTRACT

    assert sub.info.framework == "SubFrame" and sub.package == "sub_backend_mod"
    assert sub.info.contract == SUBCLASS_CONTRACT == 2  # declaring none: the contract the class stood for


def test_the_base_checks_env_and_gpus_in_one_wording(sub, tmp_path):
    from backend_helpers import H100x8, ready_env, tiny

    cpu, gpu = tiny(), tiny(cluster={"device": "cuda", "gpus_per_node": 2})
    not_ready = BackendEnv(name="sub", path=tmp_path, python=tmp_path / "python", problem="not created")
    assert sub.check(cpu, Machine(), not_ready) == "the sub env is not ready: not created"
    assert sub.check(tiny(grad_accum=2), Machine(), not_ready) == "sub takes one micro-batch per step"  # its own first
    assert sub.check(cpu, Machine(), ready_env("sub", {}, "cpu")) is None
    assert sub.check(gpu, Machine(), ready_env("sub", {}, "cuda")) == "the scenario runs on CUDA GPUs; this machine has none"
    assert sub.check(gpu, Machine(gpus=1), ready_env("sub", {}, "cuda")) == (
        "the scenario needs 2 GPUs per node; this machine has 1")
    assert sub.check(gpu, H100x8, ready_env("sub", {}, "cpu")) == (
        "the sub env is the CPU flavour (CPU torch build): recreate it with --flavour cuda")
    assert sub.check(gpu, H100x8, ready_env("sub", {}, "cuda")) is None


def test_the_base_plans_the_package_worker_in_the_standard_environment(sub, tmp_path, monkeypatch):
    from backend_helpers import make_job, ready_env, tiny

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    env = ready_env("sub", {}, "cpu")
    cpu_job = make_job("sub", tmp_path / "cpu", tiny())
    plan = sub.plan(cpu_job, env)
    assert (plan.python, plan.module, plan.args) == (env.python, "sub_backend_mod.worker", [str(cpu_job.job_file)])
    assert plan.env == {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    assert plan.files == {"job": cpu_job.job_file}
    gpu_job = make_job("sub", tmp_path / "gpu", tiny(cluster={"device": "cuda", "gpus_per_node": 1}))
    gpu_env = sub.plan(gpu_job, ready_env("sub", {}, "cuda")).env
    # one GPU of its own, the shared allocator setting, and a world of one (no DeepSpeed ops: no ZeRO declared)
    assert gpu_env["CUDA_VISIBLE_DEVICES"] == "0" and gpu_env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert gpu_env["WORLD_SIZE"] == "1" and gpu_env["MASTER_ADDR"] == "127.0.0.1" and "TORCH_EXTENSIONS_DIR" not in gpu_env


def test_the_base_reads_the_report_the_worker_sdk_wrote(sub, tmp_path):
    from backend_helpers import make_job, tiny
    from framework_bench.worker.files import MetricsWriter, write_worker_report

    job = make_job("sub", tmp_path, tiny())
    with pytest.raises(FileNotFoundError, match="the sub worker wrote no metrics and no report"):
        sub.read_report(job)
    metrics = MetricsWriter(job.run_dir, 0)
    for step in (1, 2):
        metrics.write(step, 0.5, 512, 2.0, 1000)
    metrics.close()
    write_worker_report(job.run_dir, data_sha256="ab" * 32, framework_version="9", attention_used="sdpa",
                        throughput={"tokens_per_sec": 1024.0}, settings={"trainer": "sub"}, param_count=7,
                        notes=["a note of its own"], startup_seconds=3.25,
                        startup_breakdown={"imports": 2.0, "data": 0.25, "model_build": 1.0})
    report = sub.read_report(job)
    assert [m.step for m in report.steps] == [1, 2] and report.steps[0].tokens == 512
    assert (report.data_sha256, report.framework_version, report.attention_used) == ("ab" * 32, "9", "sdpa")
    assert report.framework_throughput == {"tokens_per_sec": 1024.0}
    assert report.settings == {"trainer": "sub"} and report.param_count == 7
    assert report.startup_seconds == 3.25 and report.startup_breakdown["model_build"] == 1.0
    assert report.notes == ["a note of its own", "start-up 3.2 s: imports 2.0, data 0.2, model_build 1.0"]


def test_a_module_of_hooks_declaring_no_contract_is_of_contract_1(fake):
    assert plugins.get("fake").info.contract == 1


def test_the_bundled_backends_and_contributings_example_leave_the_report_to_the_base():
    """No backend reads its run folder by hand: the base class's `read_report` does."""
    from backend_helpers import contributing_backend
    from framework_bench.plugins.base import Backend

    root = Path(__file__).resolve().parents[1]
    written = [p for p in root.glob("backends/*/fbench_*/*.py") if "def fbench_read_report" in p.read_text()]
    assert not written and "def fbench_read_report" not in contributing_backend()[1]
    for name in ("torch", "xtuner", "llamafactory"):
        assert isinstance(plugins.manager().get_plugin(name), Backend), name


# One reference: a copy of the torch plugin that keeps `reference=True`
# (as starting from backends/torch invites) is refused like a name clash, never made the reference.

TORCH_COPY = '''
"""A third party's start from backends/torch: renamed, the reference flag kept."""
from fbench_torch import plugin


class CopiedTorch(plugin.TorchBackend):
    def info(self):
        return super().info().model_copy(update={"name": "torch_copy", "framework": "PyTorch, copied"})
'''


def test_a_second_backend_declaring_itself_the_reference_is_refused_with_the_first(site, fbench_home):
    from framework_bench.run import reference

    install_dist(site, "fbench_torch_copy", "torch_copy", "fbench_torch_copy_mod:CopiedTorch", TORCH_COPY)
    found = plugins.backends()
    assert "torch_copy" not in found and "torch" not in found
    assert reference.reference_backend() is None  # no plugin sorts its way into being the reference
    for name in ("torch", "torch_copy"):
        why = plugins.load_errors[name]
        assert "reference" in why and "fbench_torch_copy" in why and "fbench-torch" in why, why
    # one error naming both, before any run: the runs of any backend were stored unverified, saying
    # "no reference backend is installed"
    for command in (["compare", "--scenario", "tiny_cpu", "--backends", "torch,torch_copy", "--dry-run"],
                    ["compare", "--scenario", "tiny_cpu", "--backends", "xtuner", "--dry-run"],
                    ["run", "--scenario", "tiny_cpu", "--backend", "xtuner", "--db", str(site / "r.sqlite")]):
        res = CliRunner().invoke(app, command)
        assert res.exit_code == 1 and "Traceback" not in res.output
        [line] = res.stderr.strip().splitlines()
        assert line.startswith("error: no backend can be the reference: the backends 'torch'"), line
        assert "'torch_copy'" in line and "declare themselves the reference" in line, line
    assert not (site / "r.sqlite").exists()
    assert "torch_copy" in CliRunner().invoke(app, ["backends"]).stdout


def test_one_backend_declaring_itself_the_reference_is_the_reference(site):
    from framework_bench.run import reference

    install_dist(site, "fbench_torch_copy", "torch_copy", "fbench_torch_copy_mod:CopiedTorch",
                 TORCH_COPY.replace('"PyTorch, copied"', '"PyTorch, copied", "reference": False'))
    assert reference.reference_backend() == "torch" and "torch_copy" in plugins.backends()
    assert not plugins.load_errors
