#!/usr/bin/env bash
# One 8-GPU node: inference, evaluator and the two trainers on their own GPUs, the policy trainer on 2 GPUs
# with FSDP2 (conf/topology/node8.yaml). Extra arguments are Hydra overrides:
#   launchers/node8.sh steps=1000 topology.policy_trainer_procs=4
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} WANDB_MODE=${WANDB_MODE:-disabled}
exec "$PY" -m prime_values +experiment=arith topology=node8 "$@"
