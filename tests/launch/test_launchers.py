"""The ready launch configurations (launchers/*.sh + conf/topology/*.yaml) compose and validate, without running.

On this CPU machine the device-count check is pointed at the target machine with PRIME_VALUES_CUDA_COUNT (the
one-GPU and 8-GPU scripts run for real with `--cfg job`). The SLURM script needs a SLURM controller for
validation (sinfo): it is composed with Hydra's compose API from the script's own overrides and validated with
everything but the cluster check."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def run_script(name: str, *args: str, cuda_count: int):
    env = {**os.environ, "PYTHON": sys.executable, "PRIME_VALUES_CUDA_COUNT": str(cuda_count)}
    return subprocess.run([str(REPO / "launchers" / name), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def script_overrides(name: str) -> list[str]:
    """The Hydra overrides a launcher script passes to `python -m prime_values` (its `exec` line)."""
    line = next(line for line in (REPO / "launchers" / name).read_text().splitlines() if line.startswith("exec "))
    words = shlex.split(line)
    return [w for w in words[words.index("prime_values") + 1:] if w != "$@"]


def test_one_gpu_script_composes():
    result = run_script("gpu1.sh", "--cfg", "job", cuda_count=1)
    assert result.returncode == 0, result.stderr
    topo = yaml.safe_load(result.stdout)["topology"]
    assert {topo[k] for k in ("inference_device", "evaluator_device", "policy_trainer_device",
                              "value_trainer_device")} == {"cuda:0"}
    refused = run_script("gpu1.sh", "--cfg", "job", cuda_count=0)  # the check itself still works
    assert refused.returncode == 2 and "topology.inference_device=cuda:0 asks for a GPU" in refused.stderr


def test_eight_gpu_node_script_composes_and_splits_the_gpus():
    from omegaconf import OmegaConf

    from prime_values.launch import resolve_devices

    result = run_script("node8.sh", "steps=5", "--cfg", "job", cuda_count=8)
    assert result.returncode == 0, result.stderr
    cfg = yaml.safe_load(result.stdout)
    assert cfg["steps"] == 5 and cfg["topology"]["policy_trainer_procs"] == 2
    topo = OmegaConf.create(cfg["topology"])
    resolve_devices(topo, 8)  # what the conductor does on the node
    assert (topo.inference_device, topo.evaluator_device, topo.policy_trainer_device, topo.value_trainer_device) \
        == ("cuda:0", "cuda:1", "cuda:2", "cuda:4")  # the policy trainer takes cuda:2 and cuda:3
    assert topo.inference_workers == 4


def test_slurm_script_composes(monkeypatch):
    from prime_values import config
    from prime_values.launch import make_executor

    overrides = script_overrides("slurm.sh") + ["launcher.partition=gpu"]
    assert "launcher=slurm" in overrides
    cfg = config.compose(overrides)
    from prime_values.config import launcher as launcher_section

    monkeypatch.setattr(launcher_section, "_check_slurm", lambda launcher: None)  # no SLURM controller needed here
    import submitit

    # nor SLURM's client commands: submitit's executor refuses to exist without srun on the PATH, and this test
    # runs before tests/launch/test_slurm.py installs them (that file submits to a real daemon)
    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    config.validate(cfg, cuda_count=0)  # a login node without GPUs: each job brings its own
    assert cfg.topology.policy_trainer_procs == 4 and cfg.topology.value_trainer_procs == 2
    executor = make_executor(cfg.launcher, Path("/tmp/unused"), "policy_trainer", cfg.topology.policy_trainer_device,
                             tasks=cfg.topology.policy_trainer_procs)
    params = executor.parameters
    assert params["ntasks_per_node"] == 4 and params["gpus_per_node"] == 4 and params["partition"] == "gpu"


def test_local_trainer_executor_has_one_task_per_process(tmp_path):
    from omegaconf import OmegaConf

    from prime_values.config import LauncherConfig
    from prime_values.launch import make_executor

    launcher = OmegaConf.structured(LauncherConfig)
    executor = make_executor(launcher, tmp_path, "policy_trainer", "cuda:2", tasks=2)
    assert executor.parameters["tasks_per_node"] == 2 and executor.parameters["visible_gpus"] == [2, 3]
    assert make_executor(launcher, tmp_path, "inference0", "cpu").parameters["tasks_per_node"] == 1


@pytest.mark.parametrize("name", ["local.sh", "gpu1.sh", "node8.sh", "slurm.sh"])
def test_scripts_are_documented_and_executable(name):
    assert os.access(REPO / "launchers" / name, os.X_OK)
    assert f"`{name}`" in (REPO / "launchers" / "README.md").read_text()
