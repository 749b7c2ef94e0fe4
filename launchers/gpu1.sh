#!/usr/bin/env bash
# One GPU: every role a local subprocess on cuda:0 (conf/topology/gpu1.yaml). Extra arguments are Hydra overrides:
#   launchers/gpu1.sh steps=300
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} WANDB_MODE=${WANDB_MODE:-disabled}
exec "$PY" -m prime_values +experiment=arith topology=gpu1 "$@"
