"""Launchers: argv construction, the sbatch script, and how a process's end is classified."""

import sys
from pathlib import Path

from framework_bench.run.launchers import base, executor_for, local, slurm
from framework_bench.run.launchers.torchrun import TorchrunExecutor
from framework_bench.scenario import scenario
from framework_bench.plugins.contract import Job, LaunchPlan


def _job(name: str, tmp_path: Path) -> Job:
    s = scenario.load(name)
    return Job(backend="xtuner", scenario=s, data_dir=tmp_path / "data", data_sha256="0" * 64,
               run_dir=tmp_path / "run", device=s.cluster.device, nprocs=s.cluster.gpus_per_node,
               nnodes=s.cluster.nodes)


PLAN = LaunchPlan(python=Path("/envs/xtuner/bin/python"), module="fbench_xtuner.worker",
                  args=["/run/job.json"], env={"NCCL_DEBUG": "WARN", "DS_CONFIG": "/run/ds config.json"})


def test_torchrun_argv_wraps_the_worker_module(tmp_path):
    argv = executor_for("torchrun").argv(PLAN, _job("llama2_7b_8k", tmp_path))
    assert argv[:3] == ["/envs/xtuner/bin/python", "-m", "torch.distributed.run"]
    assert argv[argv.index("--nnodes") + 1] == "1"
    assert argv[argv.index("--nproc-per-node") + 1] == "8"
    assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
    assert argv[-3:] == ["-m", "fbench_xtuner.worker", "/run/job.json"]


def test_local_launcher_refuses_several_processes(tmp_path):
    job = _job("llama2_7b_8k", tmp_path)
    try:
        executor_for("local").argv(PLAN, job)
    except ValueError as e:
        assert "torchrun" in str(e)
    else:
        raise AssertionError("local launcher accepted 8 processes")


def test_sbatch_for_yi34b_128k(tmp_path):
    job = _job("yi34b_128k", tmp_path)
    text = slurm.sbatch_script([(PLAN, job)])
    assert "#SBATCH --nodes=4" in text
    assert "#SBATCH --gpus-per-node=8" in text
    assert "#SBATCH --ntasks-per-node=1" in text
    srun = [l.strip() for l in text.splitlines() if l.strip().startswith("srun ") and "torch.distributed.run" in l]
    assert len(srun) == 1 and "--nodes=4 --ntasks-per-node=1" in srun[0]
    assert '--cpus-per-task="$SLURM_CPUS_ON_NODE"' in srun[0]  # the node's CPUs, not srun's one per task
    check = [l.strip() for l in text.splitlines() if l.strip().startswith("srun ") and "fbench-shared-paths" in l]
    assert len(check) == 1 and str(job.run_dir) in check[0] and "/envs/xtuner/bin/python" in check[0]
    assert "--nnodes 4 --nproc-per-node 8" in srun[0]
    assert 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in text
    assert '--rdzv-endpoint "$head_node:29500" --rdzv-id "$SLURM_JOB_ID" -m fbench_xtuner.worker' in srun[0]
    # the plan's environment goes into the script, quoted
    assert "export DS_CONFIG='/run/ds config.json'" in text
    text = slurm.sbatch_script([(PLAN, job)], "3-04:00:00", cpus_per_task=64, extra=("--partition=gpu", "--qos=high"))
    assert "#SBATCH --time=3-04:00:00" in text and "#SBATCH --cpus-per-task=64" in text
    assert "#SBATCH --partition=gpu\n#SBATCH --qos=high" in text and "--cpus-per-task=64 --kill-on-bad-exit" in text


def _execute(tmp_path: Path, code: str, timeout=None) -> base.Outcome:
    log = tmp_path / f"log{len(list(tmp_path.glob('log*')))}"  # one log per run: a run is judged on its own
    return local.execute([[sys.executable, "-c", code]], {}, tmp_path, log, timeout)


def test_execute_classifies_endings(tmp_path):
    ok = _execute(tmp_path, "print('fine')")
    assert ok.status == "ok" and ok.returncode == 0 and "fine" in ok.log_tail
    failed = _execute(tmp_path, "raise SystemExit(3)")
    assert failed.status == "failed" and failed.returncode == 3
    oom = _execute(tmp_path, "raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB')")
    assert oom.status == "oom" and "CUDA out of memory" in oom.log_tail
    killed = _execute(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.status == "failed" and killed.returncode == -9  # a SIGKILL alone is no evidence of an OOM
    slow = _execute(tmp_path, "import time; time.sleep(30)", timeout=1)
    assert slow.status == "timeout" and slow.seconds < 20 and "timeout" in slow.log_tail


def test_loopback_nodes_share_one_rendezvous(tmp_path):
    job = _job("tiny_cpu", tmp_path).model_copy(update={"nnodes": 2, "nprocs": 1})
    argvs = TorchrunExecutor().node_argvs(PLAN, job)
    assert len(argvs) == 2
    endpoints = {a[a.index("--rdzv-endpoint") + 1] for a in argvs}
    assert len(endpoints) == 1 and endpoints.pop().startswith("127.0.0.1:")
    assert [a[a.index("--node-rank") + 1] for a in argvs] == ["0", "1"]


def test_one_failing_node_stops_the_others(tmp_path):
    argvs = [[sys.executable, "-c", "import time; time.sleep(60)"],
             [sys.executable, "-c", "import sys; print('node 1 broke'); sys.exit(2)"]]
    out = local.execute(argvs, {}, tmp_path, tmp_path / "worker.log", timeout=30)
    assert out.status == "failed" and out.returncode == 2 and out.seconds < 20
    assert "node 1 broke" in out.log_tail
    assert (tmp_path / "worker.node1.log").exists()


def test_a_launcher_says_which_refusals_stop_it():
    """A run started here stops at any refusal; one given to SLURM only at what no machine lifts
    (this machine's shortfall is why it goes to SLURM): the pipeline asks the launcher, never its type."""
    from framework_bench.run.refusals import Refusals
    elsewhere = Refusals(backend="xtuner", machine="needs 4 node(s) x 8 GPUs")
    refused = Refusals(backend="xtuner", machine="needs 4 node(s) x 8 GPUs", check="sequence_parallel 16 needs flash_attn")
    for name in ("local", "torchrun"):
        assert executor_for(name).refusal(elsewhere) == "needs 4 node(s) x 8 GPUs"
    assert executor_for("slurm").refusal(elsewhere) is None
    assert executor_for("slurm").refusal(refused) == refused.reason


def test_where_bytecode_is_forbidden_workers_write_it_beside_the_envs(tmp_path, monkeypatch):
    """The shell's PYTHONDONTWRITEBYTECODE does not reach a worker (every run would compile its
    imports from source: the envs are installed without bytecode): it writes its bytecode beside
    the envs, never beside the sources; a plan that forbids it is obeyed. The SLURM script says
    the same, whatever characters the state folder's path holds."""
    import os
    import subprocess

    from framework_bench.envs.venvs import bytecode_dir
    monkeypatch.setenv("FBENCH_HOME", str(tmp_path / "a state's folder"))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    code = ("import os, sys; print('said', os.environ.get('PYTHONDONTWRITEBYTECODE'), sys.dont_write_bytecode, "
            "sys.pycache_prefix)")
    plain = _execute(tmp_path, code)
    assert plain.status == "ok" and f"said None False {bytecode_dir()}" in plain.log_tail
    log = tmp_path / "planned.log"
    planned = local.execute([[sys.executable, "-c", code]], {"PYTHONDONTWRITEBYTECODE": "1"}, tmp_path, log)
    assert planned.status == "ok" and "said 1 True" in planned.log_tail

    lines = slurm.sbatch_script([(PLAN, _job("tiny_cpu", tmp_path))]).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("fbench_bytecode="))
    said = subprocess.run(["bash", "-c", "\n".join([*lines[start:start + 2], 'echo "$PYTHONPYCACHEPREFIX"'])],
                          capture_output=True, text=True, env=dict(os.environ), check=True).stdout
    assert said.strip() == str(bytecode_dir())


def test_state_folders_linking_one_envs_folder_share_its_bytecode(tmp_path, monkeypatch):
    """Two state folders whose `envs` is a link to one folder (each test's, a user's second
    checkout): a worker of either imports the env's modules from the same source path, so what the
    first compiled beside the envs the second reads, rather than compiling its own copy."""
    import subprocess

    from framework_bench.envs import venvs
    from framework_bench.envs.site_layers import purelib
    real = tmp_path / "real" / "envs"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(real / "probe")], check=True)
    (purelib(real / "probe" / "bin" / "python") / "fbench_probe.py").write_text("x = 1\n")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    for state in ("a", "b"):
        (tmp_path / state).mkdir()
        (tmp_path / state / "envs").symlink_to(real)
        monkeypatch.setenv("FBENCH_HOME", str(tmp_path / state))
        python = venvs.inspect("probe").python
        out = local.execute([[str(python), "-c", "import fbench_probe"]], {}, tmp_path, tmp_path / f"{state}.log")
        assert out.status == "ok", out.log_tail
    compiled = list((real / ".bytecode").rglob("fbench_probe.*.pyc"))
    assert len(compiled) == 1 and str(real.resolve()) in str(compiled[0]), compiled
