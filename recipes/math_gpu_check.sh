#!/usr/bin/env bash
# A few RL steps of the math recipe (+experiment=math) on ONE GPU, offline, as one call on a lent H200, printing
# inference tokens/s, value-evaluator scoring tokens/s, policy-trainer and value-trainer step times
# (recipes/math.md, Figures). The model is Qwen3-0.6B's shape with random weights and the data a synthetic
# GSM8K-format file (recipes/math_gpu_check.py prepare): throughput is valid, learning is not.
#
#   here, once:   .venv/bin/python recipes/math_gpu_check.py site      # pure-Python packages -> .gpu_site
#   GPU machine:  bash recipes/math_gpu_check.sh                       # run tool: carry [".gpu_site"]
#   CPU dry run:  DEVICE=cpu SIZE=tiny STEPS=2 PROMPTS=2 GROUP=2 MAX_NEW=16 PY=.venv/bin/python \
#                     bash recipes/math_gpu_check.sh
#
# Every role (inference, evaluator, policy trainer, value trainer; the warm-start job before them) runs on
# $DEVICE. inference=vllm when vllm imports (the vLLM backend, prime_values/backends; its overrides in
# VLLM_OVERRIDES), else inference=hf with a note. Stages: rl only (no sft, no eval stage); critic warm start off;
# held-out accuracy only at the first and the last step, on 8 prompts. The run is cut at RUN_TIMEOUT seconds
# (the conductor stops its roles) and the figures are printed from whatever metrics it wrote by then.
# Output (also under $OUT for the run tool): versions.txt, prepare.json, run.log, attention.txt, figures.txt,
# figures.json, summary.json, role_errors.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
DEVICE="${DEVICE:-cuda:0}"; SIZE="${SIZE:-0.6b}"; STEPS="${STEPS:-5}"; PROMPTS="${PROMPTS:-16}"
GROUP="${GROUP:-8}"; MAX_NEW="${MAX_NEW:-512}"; DTYPE="${DTYPE:-float32}"; ATTN="${ATTN:-auto}"
RUN_TIMEOUT="${RUN_TIMEOUT:-420}"; WORK="${WORK:-/tmp/math_gpu_check}"; OUT="${OUT:-$WORK/out}"
VLLM_OVERRIDES="${VLLM_OVERRIDES:-inference=vllm}"
mkdir -p "$WORK" "$OUT"
rm -rf "$WORK/run"
export PYTHONPATH="$PWD/.gpu_site:$PWD:$WORK/standin_site${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
started=$(date +%s)
echo "== math_gpu_check $(date -u +%Y-%m-%dT%H:%MZ): DEVICE=$DEVICE SIZE=$SIZE STEPS=$STEPS PROMPTS=$PROMPTS GROUP=$GROUP MAX_NEW=$MAX_NEW DTYPE=$DTYPE ATTN=$ATTN"
"$PY" recipes/math_gpu_check.py probe 2>&1 | tee "$OUT/versions.txt"

if "$PY" -c "import flash_attn" 2>/dev/null && [[ "$DEVICE" == cuda* ]]; then
  echo "== flash-attn imports: the gpu test of policy.attn_implementation=auto (flash vs sdpa logits)"
  "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -k attention 2>&1 | tail -5 | tee "$OUT/attention_test.txt"
fi

echo "== prepare ($SIZE model with random weights, synthetic GSM8K data) in $WORK"
"$PY" recipes/math_gpu_check.py prepare --size "$SIZE" --dir "$WORK" --device "$DEVICE" | tee "$OUT/prepare.json" \
  || { echo "prepare failed"; exit 1; }

if "$PY" -c "import vllm" 2>/dev/null; then
  INFERENCE="$VLLM_OVERRIDES"; echo "== vllm imports: $INFERENCE"
else
  INFERENCE="inference=hf"; echo "== NOTE: vllm does not import here: inference=hf (transformers generate); the inference figure is the hf backend's"
fi
set -x
timeout -k 30 "$RUN_TIMEOUT" "$PY" -m prime_values +experiment=math stages=[rl] \
  policy.model="$WORK/model" policy.dtype="$DTYPE" policy.attn_implementation="$ATTN" \
  task.data="$WORK/gsm8k_synthetic.jsonl" task.heldout_data=null task.heldout_size=8 \
  steps="$STEPS" eval_every="$STEPS" inference.prompts_per_step="$PROMPTS" inference.group_size="$GROUP" \
  inference.max_new_tokens="$MAX_NEW" critic.warm_start.steps=0 replay.min_rollouts=$((PROMPTS * GROUP / 2)) \
  topology.inference_device="$DEVICE" topology.evaluator_device="$DEVICE" \
  topology.policy_trainer_device="$DEVICE" topology.value_trainer_device="$DEVICE" \
  $INFERENCE hydra.run.dir="$WORK/run" > "$OUT/run.log" 2>&1
rc=$?
set +x
tail -25 "$OUT/run.log"
echo "== run exit status $rc ($(( $(date +%s) - started )) s since the start of the script; 124 = cut at RUN_TIMEOUT=$RUN_TIMEOUT s)"
grep -rh "attention: " "$WORK/run/jobs" 2>/dev/null | sed 's/^[0-9-]* [0-9:,]* //' | sort | uniq -c | tee "$OUT/attention.txt"
for err in "$WORK"/run/jobs/*/*.err; do
  [[ -s "$err" ]] && grep -q "Traceback" "$err" && { echo "--- $err"; tail -30 "$err"; }
done > "$OUT/role_errors.txt" 2>/dev/null
[[ -s "$OUT/role_errors.txt" ]] && { echo "== role errors (role_errors.txt):"; head -60 "$OUT/role_errors.txt"; }
cp "$WORK/run/report/summary.json" "$OUT/summary.json" 2>/dev/null
echo "== figures ($SIZE, $DTYPE, $INFERENCE, $PROMPTS prompts x $GROUP samples, <= $MAX_NEW new tokens, all roles on $DEVICE)"
"$PY" recipes/math_gpu_check.py figures "$WORK/run" --json "$OUT/figures.json" | tee "$OUT/figures.txt"
exit $rc
