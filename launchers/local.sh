#!/usr/bin/env bash
# One machine, every role a local subprocess (submitit's local executor). Extra arguments are Hydra overrides:
#   launchers/local.sh +experiment=arith steps=100 topology=colocated
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} WANDB_MODE=${WANDB_MODE:-disabled}
exec "$PY" -m prime_values "${@:-+experiment=arith}"
