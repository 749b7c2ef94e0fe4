#!/usr/bin/env bash
# Build .gpu_site HERE (a machine with network), for a lent GPU machine that has none: the pure-Python packages it
# lacks (Hydra, OmegaConf and its ANTLR runtime, submitit and cloudpickle; math-verify and its LaTeX parser for
# bench/math_gpu_check.sh), installed with pip into one folder that the device call carries (put on PYTHONPATH by
# bench/gpu_check.sh). Pinned to what the project is tested with; no compiled file is allowed in (the GPU machine
# runs Python 3.12 with torch 2.11 + CUDA 13, this one 3.11: only pure Python travels), and the folder must stay
# well inside the 64 MiB a device call carries.
#   bash bench/gpu_site.sh            # -> .gpu_site (~5 MB)
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="${PIP:-/work/main/.venv/bin/pip}"; [[ -x "$PIP" ]] || PIP="python3 -m pip"
SITE="${SITE:-.gpu_site}"
PACKAGES=(hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 submitit==1.5.4 cloudpickle==3.1.3
          math-verify==0.9.0 latex2sympy2_extended==1.11.0)
rm -rf "$SITE"
# --no-deps: torch, transformers, numpy, PyYAML and typing_extensions are on the GPU machine already
$PIP install --quiet --no-deps --no-compile --target "$SITE" "${PACKAGES[@]}"
compiled=$(find "$SITE" \( -name '*.so' -o -name '*.pyd' \) | head -3)
if [[ -n "$compiled" ]]; then echo "compiled files in $SITE (they would not match the GPU machine): $compiled" >&2; exit 1; fi
find "$SITE" -name __pycache__ -prune -exec rm -rf {} +
size=$(du -sm "$SITE" | cut -f1)
(( size < 40 )) || { echo "$SITE is $size MiB: too much of the 64 MiB a device call carries" >&2; exit 1; }
echo "$SITE: ${PACKAGES[*]} ($size MiB)"
