#!/usr/bin/env bash
# A SLURM cluster: run on a login node (in tmux/screen: it follows the run; Ctrl-C stops it cleanly). The whole
# pipeline is one sbatch job (8 GPUs, 8 CPUs per role process: conf/topology/slurm_gpu.yaml, launcher=slurm)
# whose roles run as srun steps of it. The run directory must be on a filesystem every node shares. Extra
# arguments are Hydra overrides, e.g.
#   launchers/slurm.sh launcher.partition=gpu launcher.account=myproj launcher.setup='[module load cuda/12.4]'
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} WANDB_MODE=${WANDB_MODE:-disabled}
exec "$PY" -m prime_values +experiment=arith launcher=slurm topology=slurm_gpu launcher.cpus_per_task=8 "$@"
