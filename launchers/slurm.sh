#!/usr/bin/env bash
# A SLURM cluster: run on a login node (in tmux/screen: the conductor stays up for the whole run); every role
# becomes an sbatch job with its own GPUs (conf/topology/slurm_gpu.yaml, launcher=slurm). The run directory
# must be on a filesystem every node shares. Extra arguments are Hydra overrides, e.g.
#   launchers/slurm.sh launcher.partition=gpu launcher.account=myproj launcher.setup='[module load cuda/12.4]'
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} WANDB_MODE=${WANDB_MODE:-disabled}
exec "$PY" -m prime_values +experiment=arith launcher=slurm topology=slurm_gpu launcher.cpus_per_task=8 "$@"
