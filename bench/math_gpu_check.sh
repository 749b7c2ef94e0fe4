#!/usr/bin/env bash
# A few RL steps of the math recipe (+experiment=math) on ONE GPU, offline, as one call on a lent H200, printing
# inference tokens/s, value-evaluator scoring tokens/s, policy-trainer and value-trainer step times
# (recipes/math.md, Figures). The model is Qwen3-0.6B's shape with random weights and the data a synthetic
# GSM8K-format file (bench/math_gpu_check.py prepare): throughput is valid, learning is not.
#
#   here, once:   .venv/bin/python -m bench.math_gpu_check site      # pure-Python packages -> .gpu_site
#   GPU machine:  bash bench/math_gpu_check.sh                       # run tool: carry [".gpu_site"]
#   CPU dry run:  DEVICE=cpu SIZE=tiny STEPS=2 PROMPTS=2 GROUP=2 MAX_NEW=16 PY=.venv/bin/python \
#                     bash bench/math_gpu_check.sh
#
# Every role (inference, evaluator, policy trainer, value trainer; the warm-start job before them) runs on
# $DEVICE. inference=vllm when vllm imports (the vLLM backend, prime_values/backends; its overrides in
# VLLM_OVERRIDES), else inference=hf with a note. Stages: rl only (no sft, no eval stage); critic warm start off;
# held-out accuracy only at the first and the last step, on 8 prompts. The run is cut at RUN_TIMEOUT seconds
# (the conductor stops its roles) and the figures are printed from whatever metrics it wrote by then; a vllm run
# that fails before its first policy step, or generates nothing in FIRST_CHUNK_S seconds, is retried with
# inference=hf when BUDGET leaves time.
# Output (also under $OUT for the run tool): versions.txt, prepare.json, run.log, attention.txt, figures.txt,
# figures.json, summary.json, role_errors.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
DEVICE="${DEVICE:-cuda:0}"; SIZE="${SIZE:-0.6b}"; STEPS="${STEPS:-5}"; PROMPTS="${PROMPTS:-16}"
GROUP="${GROUP:-8}"; MAX_NEW="${MAX_NEW:-512}"; DTYPE="${DTYPE:-auto}"; ATTN="${ATTN:-auto}"  # auto: bf16-mixed on CUDA
RUN_TIMEOUT="${RUN_TIMEOUT:-420}"; WORK="${WORK:-/tmp/math_gpu_check}"; OUT="${OUT:-$WORK/out}"
# vLLM shares the GPU with three other roles: a 32 GiB KV cache (~146k tokens of this model in fp32: the whole step's
# 128 sequences at once) set directly, not sized by profiling while the other roles allocate on the same GPU; and
# a 35% memory share for its start-up check, not vLLM's default 90%
VLLM_OVERRIDES="${VLLM_OVERRIDES:-inference=vllm +inference.vllm_args.gpu_memory_utilization=0.35 +inference.vllm_args.kv_cache_memory_bytes=34359738368}"
BUDGET="${BUDGET:-560}"  # seconds for the whole script (the run tool's limit is 600)
# 0: versions are published without the Adam state (4.8 GB a version at 0.6B in fp32; the disk is 64 GiB), so the
# policy step time excludes saving it; the recipe's default is 1. A failing role fails the run (max_restarts=0).
OPT_STATE_EVERY="${OPT_STATE_EVERY:-0}"
FIRST_CHUNK_S="${FIRST_CHUNK_S:-300}"  # a vllm run with no generated chunk by then is stopped (then inference=hf)
mkdir -p "$WORK" "$OUT"
started=$(date +%s)
export PYTHONPATH="$PWD/.gpu_site:$PWD:$WORK/standin_site${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
echo "== math_gpu_check $(date -u +%Y-%m-%dT%H:%MZ): DEVICE=$DEVICE SIZE=$SIZE STEPS=$STEPS PROMPTS=$PROMPTS GROUP=$GROUP MAX_NEW=$MAX_NEW DTYPE=$DTYPE ATTN=$ATTN"
"$PY" -m bench.math_gpu_check probe 2>&1 | tee "$OUT/versions.txt"

if "$PY" -c "import flash_attn" 2>/dev/null && [[ "$DEVICE" == cuda* ]]; then
  echo "== flash-attn imports: the gpu test of policy.attn_implementation=auto (flash vs sdpa logits)"
  "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/e2e/test_gpu.py -k attention 2>&1 | tail -5 | tee "$OUT/attention_test.txt"
fi

echo "== prepare ($SIZE model with random weights, synthetic GSM8K data) in $WORK"
"$PY" -m bench.math_gpu_check prepare --size "$SIZE" --dir "$WORK" --device "$DEVICE" | tee "$OUT/prepare.json" \
  || { echo "prepare failed"; exit 1; }

run_rl() {  # $1: the inference overrides, $2: the time limit in seconds, $3: seconds to the first chunk (or none)
  rm -rf "$WORK/run"
  echo "== RL: +experiment=math stages=[rl], $1, cut at $2 s"
  timeout -k 30 "$2" "$PY" -m prime_values +experiment=math stages=[rl] \
    policy.model="$WORK/model" policy.dtype="$DTYPE" policy.attn_implementation="$ATTN" \
    task.data="$WORK/gsm8k_synthetic.jsonl" task.heldout_data=null task.heldout_size=8 \
    steps="$STEPS" eval_every="$STEPS" inference.prompts_per_step="$PROMPTS" inference.group_size="$GROUP" \
    inference.max_new_tokens="$MAX_NEW" critic.warm_start.steps=0 replay.min_rollouts=$((PROMPTS * GROUP / 2)) \
    topology.inference_device="$DEVICE" topology.evaluator_device="$DEVICE" \
    topology.policy_trainer_device="$DEVICE" topology.value_trainer_device="$DEVICE" \
    launcher.max_restarts=0 log.keep_weights=1 log.optimizer_state_every="$OPT_STATE_EVERY" \
    $1 hydra.run.dir="$WORK/run" > "$OUT/run.log" 2>&1 &
  local pid=$! t0
  t0=$(date +%s)
  while kill -0 "$pid" 2>/dev/null; do
    sleep 5
    if [[ -n "${3:-}" ]] && (( $(date +%s) - t0 > $3 )) \
        && ! grep -qs generate_tokens_per_s "$WORK"/run/metrics/inference*.jsonl; then
      echo "== no generated chunk within $3 s: stopping this run"
      kill -TERM "$pid"; wait "$pid"; return 125
    fi
  done
  wait "$pid"
}
left() { echo $(( BUDGET - ($(date +%s) - started) )); }
if "$PY" -c "import vllm" 2>/dev/null; then
  INFERENCE="$VLLM_OVERRIDES"; echo "== vllm imports: $INFERENCE"
else
  INFERENCE="inference=hf"; echo "== NOTE: vllm does not import here: inference=hf (transformers generate); the inference figure is the hf backend's"
fi
limit=$(left); (( limit > RUN_TIMEOUT )) && limit=$RUN_TIMEOUT
if [[ "$INFERENCE" == *vllm* ]]; then run_rl "$INFERENCE" "$limit" "$FIRST_CHUNK_S"; else run_rl "$INFERENCE" "$limit"; fi
rc=$?
if [[ $rc != 0 && $rc != 124 && "$INFERENCE" == *vllm* ]] && ! grep -q '"train_s"' "$WORK/run/metrics/policy_trainer.jsonl" 2>/dev/null \
    && (( $(left) > 150 )); then
  echo "== the vllm run failed (exit $rc; 125: no chunk within FIRST_CHUNK_S) before any policy step:"
  tail -15 "$OUT/run.log"
  grep -rh -B2 -A12 "Traceback" "$WORK"/run/jobs/inference*/*.err 2>/dev/null | tail -40 | tee "$OUT/vllm_error.txt"
  cp "$OUT/run.log" "$OUT/run_vllm.log"
  INFERENCE="inference=hf"; echo "== NOTE: falling back to inference=hf"
  run_rl "$INFERENCE" $(( $(left) - 40 ))
  rc=$?
fi
tail -25 "$OUT/run.log"
echo "== run exit status $rc ($(( $(date +%s) - started )) s since the start of the script; 124 = cut at RUN_TIMEOUT=$RUN_TIMEOUT s)"
grep -rh "attention: " "$WORK/run/jobs" 2>/dev/null | sed 's/^[0-9-]* [0-9:,]* //' | sort | uniq -c | tee "$OUT/attention.txt"
for err in "$WORK"/run/jobs/*/*.err; do
  [[ -s "$err" ]] && grep -q "Traceback" "$err" && { echo "--- $err"; tail -30 "$err"; }
done > "$OUT/role_errors.txt" 2>/dev/null
[[ -s "$OUT/role_errors.txt" ]] && { echo "== role errors (role_errors.txt):"; head -60 "$OUT/role_errors.txt"; }
cp "$WORK/run/report/summary.json" "$OUT/summary.json" 2>/dev/null
echo "== figures ($SIZE, $DTYPE, $INFERENCE, $PROMPTS prompts x $GROUP samples, <= $MAX_NEW new tokens, all roles on $DEVICE)"
"$PY" -m bench.math_gpu_check figures "$WORK/run" --json "$OUT/figures.json" | tee "$OUT/figures.txt"
exit $rc
