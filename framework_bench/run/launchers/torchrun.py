"""The `torchrun` launcher: the worker module under `python -m torch.distributed.run` from the
backend's own env (the host has no torch), one torchrun per node, all meeting at one
rendezvous; processes started and watched as the `local` launcher does.
"""

from __future__ import annotations

from framework_bench.plugins.contract import Job, LaunchPlan
from framework_bench.plugins.plan_env import free_port
from framework_bench.run.launchers.base import RDZV_PORT
from framework_bench.run.launchers.local import LocalExecutor


def torchrun_argv(plan: LaunchPlan, job: Job, endpoint: str = f"127.0.0.1:{RDZV_PORT}",
                  node_rank: int | None = None, rdzv_id: str | None = None) -> list[str]:
    argv = [str(plan.python), "-m", "torch.distributed.run",
            "--nnodes", str(job.nnodes), "--nproc-per-node", str(job.nprocs),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
    if node_rank is not None:
        argv += ["--node-rank", str(node_rank)]
    if rdzv_id is not None:
        argv += ["--rdzv-id", rdzv_id]
    return argv + ["-m", plan.module, *plan.args]


class TorchrunExecutor(LocalExecutor):
    name = "torchrun"

    def argv(self, plan: LaunchPlan, job: Job) -> list[str]:
        return torchrun_argv(plan, job)

    def node_argvs(self, plan: LaunchPlan, job: Job) -> list[list[str]]:
        """One torchrun per node, all meeting on a free loopback port. Several nodes from one
        machine only test the multi-node rendezvous; clusters use `slurm`."""
        endpoint = f"127.0.0.1:{free_port()}"
        ranks = range(job.nnodes) if job.nnodes > 1 else [None]
        return [torchrun_argv(plan, job, endpoint=endpoint, node_rank=n) for n in ranks]
