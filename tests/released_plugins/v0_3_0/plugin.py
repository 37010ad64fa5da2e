from pathlib import Path

from framework_bench.plugins.contract import BackendInfo, Capabilities, EnvSpec
from framework_bench.plugins.base import Backend

HERE = Path(__file__).resolve().parent


class MyBackend(Backend):
    def info(self):
        return BackendInfo(name="mybackend", framework="PyTorch (minimal loop)", contract=4,
                           capabilities=Capabilities(cpu=True, gpu=False, sequence_parallel=False, varlen=False),
                           env=EnvSpec(requirements={"cpu": HERE / "requirements-cpu.txt"}, framework_package="torch"))

    def check(self, scenario, machine, env):
        if scenario.cluster.gpus > 1 or scenario.grad_accum > 1 or scenario.precision != "fp32":
            return "the minimal loop runs one process, one fp32 micro-batch per optimizer step"
        return super().check(scenario, machine, env)  # the env, the GPUs: one wording for every backend
