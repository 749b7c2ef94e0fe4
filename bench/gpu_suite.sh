#!/usr/bin/env bash
# The benchmark suite's GPU mode, as one script for a lent GPU machine (never part of CI):
#   python -m bench --device cuda:0 — every pipeline role and the scoring benchmark's models on the one GPU (the roles
#   time-share it; the table's header says so), the log and GAE benchmarks on the CPU as always.
# Packages the machine lacks travel as pure-Python copies in .gpu_site (made here with
# `.venv/bin/python -m bench.math_gpu_check site`; the device call carries [".gpu_site"]).
# Results: $OUT/bench/results.{md,json}; add the table to docs/benchmarks.md with the date and the hardware.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/.gpu_site:$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/gpu_suite}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
# 30 policy steps x 5 cases x 2 repetitions after one shared warm start: ~4 policy steps/s on one H200
# (docs/benchmarks.md, "The CUDA path"), so a few minutes; STEPS / REPS shorten it if the device time is short
timeout "${LIMIT_S:-540}" python3 -m bench --device cuda:0 --steps "${STEPS:-30}" --reps "${REPS:-2}" \
    --out "$OUT/bench" 2>&1 | tail -60 | tee "$OUT/suite.log"
