#!/usr/bin/env bash
# The checks that need a CUDA device, as one script for a lent GPU machine (never part of CI):
#   the gpu-marked tests, then the embedded experiment with every role on the GPU, timed.
# Packages the machine lacks travel as a folder of pure-Python copies (.gpu_site: hydra, omegaconf, antlr4,
# submitit) put on PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/.gpu_site:$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/gpu_check}"; mkdir -p "$OUT"
python3 -c "import torch, transformers; from prime_values.models.sampling import _cache_kwarg; from transformers import Qwen3ForCausalLM as Q, Qwen3Config as C; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0), 'kv-cache argument:', _cache_kwarg(Q(C(num_hidden_layers=1, hidden_size=64, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=64))))"
python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.log"
GPU="topology.inference_device=cuda:0 topology.evaluator_device=cuda:0 topology.policy_trainer_device=cuda:0 topology.value_trainer_device=cuda:0"
time python3 -m prime_values +experiment=arith steps=60 eval_every=20 $GPU hydra.run.dir=/tmp/gpu_run 2>&1 | tail -40 | tee "$OUT/gpu_run.log"
cp /tmp/gpu_run/report/summary.json "$OUT/summary.json" 2>/dev/null
cp /tmp/gpu_run/report/learning.png "$OUT/learning.png" 2>/dev/null
