#!/usr/bin/env bash
# The paper's experiments as runnable blocks (sections 3-5, appendix B and C).
#
#   ./run_all.sh --dry-run all           # print every command of every block
#   MPS=1 ./run_all.sh small              # the small-scale reproduction on SmolLM2 (one GPU; 21.5 min on an H200)
#   NGPU=4 JUDGE_URL=http://127.0.0.1:8000/v1 ./run_all.sh sweeps single
#
# Blocks: small sweeps single sequential joint relearn ablations. Each block can run alone; the
# blocks after `sweeps` use the paper's selected hyperparameters (losses.HPARAMS), not the sweep's.
# Models are hub ids (a local copy works too). Evaluation uses the LLM judge at $JUDGE_URL (the
# paper's judge is Qwen3.5-35B-A3B, served with vLLM or SGLang); JUDGE=heuristic for a rough offline run.
set -euo pipefail
cd "$(dirname "$0")"

DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
[ $# -ge 1 ] || { sed -n '2,13p' "$0"; exit 1; }

NGPU=${NGPU:-1}
RUNS=${RUNS:-runs}
JUDGE=${JUDGE:-http}
JUDGE_URL=${JUDGE_URL:-http://127.0.0.1:8000/v1}
LLAMA=${LLAMA:-meta-llama/Llama-3.2-3B-Instruct}
MINISTRAL=${MINISTRAL:-mistralai/Ministral-3-3B-Instruct-2512-BF16}
QWEN=${QWEN:-Qwen/Qwen3.5-9B}
METHODS_ALL="graddiff jensun npo pdu rmu satimp simnpo undial wga jensunpp dpo ga"
METHODS_TOP5="graddiff jensun npo pdu jensunpp"        # the five methods of the multi-model tables
SMALL_METHODS=${SMALL_METHODS:-$METHODS_ALL}            # block small: the methods to unlearn with
JOBS=${JOBS:-5}        # block small: methods at a time, each training its learning rates side by side
SMALL_LR_FACTORS=${SMALL_LR_FACTORS:-"3 10 30"}         # block small: multiples of each method's Llama LR
# block small: extra train.py flags. Micro-batches of 8 reach the authors' global batch of 32 in 4
# accumulation steps (half the GPU launches of 4 x 8).
SMALL_TRAIN_ARGS=${SMALL_TRAIN_ARGS:---batch-size 8}
# block small: MPS=1 starts a CUDA MPS daemon for the block (unless one runs), so that the kernels of the
# side-by-side processes overlap instead of taking turns: 12 SmolLM2 trainings, 44 -> 74 steps/s (README, Speed).
MPS=${MPS:-0}

run() { echo "+ $*"; if [ $DRY = 0 ]; then "$@"; fi; }
train() { run torchrun --nproc_per_node="$NGPU" train.py --refusal paper "$@"; }   # the paper's refusals; a later --refusal wins
evaluate() { run python evaluate.py "$@" --judge "$JUDGE" --judge-url "$JUDGE_URL"; }

pool() {   # run each line of stdin as a shell command, $JOBS at a time (small models share one GPU)
  local line pid failed=0
  while IFS= read -r line; do
    echo "+ $line"
    [ $DRY = 1 ] && continue
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || failed=$((failed + 1)); done
    OMP_NUM_THREADS=2 bash -c "$line" &
  done
  for pid in $(jobs -p); do wait "$pid" || failed=$((failed + 1)); done
  [ $failed = 0 ] || { echo "pool: $failed command(s) failed, see their .log files"; return 1; }
}

MPS_STARTED=0
start_mps() {    # for block small only: the blocks after it (torchrun, NCCL) run without it
  [ "$MPS" = 1 ] || return 0
  if [ -e "${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}/control" ]; then echo "MPS: a daemon is running already"; return 0; fi
  run nvidia-cuda-mps-control -d
  MPS_STARTED=1
}
stop_mps() {
  [ $MPS_STARTED = 1 ] || return 0
  MPS_STARTED=0
  run bash -c "echo quit | nvidia-cuda-mps-control"
}
BASE_PID=""
small_cleanup() {   # on any exit: no evaluation left running behind, no daemon left up
  [ -z "$BASE_PID" ] || kill "$BASE_PID" 2>/dev/null || true
  stop_mps
}

block_small() {
  # Small-scale reproduction on one GPU (README, "Small-scale reproduction"). SmolLM2-135M-Instruct
  # does not know SUITE's facts, so first inject them: fine-tune on every Challenger question (train and
  # eval wordings) and the retain rows. Then unlearn the injected model with every method on the
  # training split only, at the authors' settings (20 epochs, global batch 32, lambdas of losses.HPARAMS)
  # and three learning rates per method (its Llama LR from the paper x $SMALL_LR_FACTORS); pick per
  # method the run with the highest Retain - Q_All; add repetitiveness for the picked run; one table.
  # Heuristic judge throughout (approximate); no RGQ (the heuristic judge cannot compare open answers).
  # One pool job per method (its learning rates train side by side), so every method that finishes is
  # complete; $SMALL_METHODS picks a subset (e.g. to split the block over two machines: the injection
  # is deterministic). Resumable: finished trainings and evaluations are skipped.
  local out=$RUNS/small ev="--topics challenger_disaster --judge heuristic --batch-size 256 ${MMLU_FILE:+--mmlu-file $MMLU_FILE}"
  local inject=$out/injected/final m lr d lr_table
  local -A lrs=()
  lr_table=$(python -c "import losses
for m in '$SMALL_METHODS'.split():
    print(m, *('%.2g' % (losses.resolve_hparams(m, 'llama')['lr'] * float(f)) for f in '$SMALL_LR_FACTORS'.split()))")
  while read -r m lr; do lrs[$m]=$lr; done <<< "$lr_table"
  [ $DRY = 1 ] || trap small_cleanup EXIT
  start_mps
  run python -c "import model; model.smollm2_folder()"      # convert the GGUF once, before two processes read it
  # the base model's evaluation runs beside the injection (one process each: the GPU has room)
  echo "+ python evaluate.py smollm2 $ev --skip rgq --out $out/eval_base > $out/eval_base.log 2>&1 &"
  if [ $DRY = 0 ] && [ ! -f "$out/eval_base/metrics.json" ]; then
    mkdir -p "$out"
    python evaluate.py smollm2 $ev --skip rgq --out "$out/eval_base" > "$out/eval_base.log" 2>&1 & BASE_PID=$!
  fi
  run python train.py --method nll --relearn-set inject --model smollm2 --topics challenger_disaster \
      --lr 1e-4 --epochs 4 --global-batch 16 --batch-size 16 --deterministic --out "$out/injected"
  { echo "[ -f $out/eval_injected/metrics.json ] || python evaluate.py $inject $ev --skip rgq --out $out/eval_injected > $out/eval_injected.log 2>&1"
    for m in $SMALL_METHODS; do
      local line=""
      for lr in ${lrs[$m]}; do
        d=$out/sweep/$m-lr$lr
        line+="{ python train.py --method $m --model $inject --topics challenger_disaster --lr $lr $SMALL_TRAIN_ARGS --print-every 60 --out $d > $d.log 2>&1 && { [ -f $d/eval/final/metrics.json ] || python evaluate.py $d $ev --skip rep rgq >> $d.log 2>&1; }; } & "
      done
      # then the method's pick (its sweep table), and repetitiveness for it (answers and MMLU are reused)
      echo "$line""wait; python evaluate.py --table $out/sweep/$m.md --runs \$(dirname $out/sweep/$m-lr*/eval/final/metrics.json) > /dev/null && while read -r d; do python evaluate.py \${d%/eval/final} $ev --skip rgq >> \${d%/eval/final}.log 2>&1; done < $out/sweep/$m.selected"
    done; } | { [ $DRY = 1 ] || mkdir -p "$out/sweep"; pool || echo "the table below holds the methods that finished"; }
  local finished
  finished=$(ls "$out"/sweep/*/eval/final/metrics.json 2>/dev/null | xargs -r dirname || echo "$out/sweep/METHOD-lrLR/eval/final")
  [ -z "$BASE_PID" ] || wait "$BASE_PID" || echo "the base model's evaluation failed, see $out/eval_base.log"
  BASE_PID=""
  stop_mps
  run python evaluate.py --table "$out/results.md" --runs base="$out/eval_base" injected="$out/eval_injected" $finished
}

block_sweeps() {
  # Appendix tables tab:llama_hp_lr and tab:llama_hp_alpha: LR sweep, then lambda sweep, on Challenger with Llama.
  local -A LRS=([graddiff]="3e-7 4e-7 5e-7 1e-6" [jensun]="2e-6 4e-6 5e-6 8e-6" [npo]="5e-6 8e-6 1e-5 2e-5"
                [pdu]="1e-6 3e-6 5e-6 8e-6" [rmu]="3e-5 7e-5 1e-4 3e-4" [satimp]="7e-6 8e-6 1e-5 3e-5"
                [simnpo]="7e-6 1e-5 2e-5 3e-5" [undial]="5e-5 1e-4 5e-4" [wga]="5e-6 8e-6 1e-5 2e-5"
                [jensunpp]="1e-6 2e-6 3e-6 4e-6")
  local -A LAMBDAS=([graddiff]="--lambda-r 0.5 --lambda-r 1 --lambda-r 2 --lambda-r 5"
                    [jensun]="--lambda-r 0.25 --lambda-r 0.5 --lambda-r 1 --lambda-r 2"
                    [npo]="--lambda-r 0.5 --lambda-r 1 --lambda-r 3 --lambda-r 5"
                    [pdu]="--lambda-r 0.25 --lambda-r 0.5 --lambda-r 1" [rmu]="--lambda-r 0.25 --lambda-r 1 --lambda-r 3"
                    [satimp]="--lambda-r 0.5 --lambda-r 1 --lambda-r 2" [simnpo]="--lambda-r 0.5 --lambda-r 1 --lambda-r 2"
                    [undial]="--lambda-r 0 --lambda-r 0.25 --lambda-r 1" [wga]="--lambda-r 0.5 --lambda-r 1 --lambda-r 2 --lambda-r 5"
                    [jensunpp]="--lambda-f 0.2 --lambda-f 0.33 --lambda-f 0.5 --lambda-f 1")
  for m in "${!LRS[@]}"; do
    for lr in ${LRS[$m]}; do
      train --method "$m" --model "$LLAMA" --topics challenger_disaster --lr "$lr" --out "$RUNS/sweep/$m-lr$lr"
      evaluate "$RUNS/sweep/$m-lr$lr" --topics challenger_disaster
    done
    set -- ${LAMBDAS[$m]}
    while [ $# -gt 0 ]; do
      train --method "$m" --model "$LLAMA" --topics challenger_disaster "$1" "$2" --out "$RUNS/sweep/$m${1#--}$2"
      evaluate "$RUNS/sweep/$m${1#--}$2" --topics challenger_disaster
      shift 2
    done
  done
}

block_single() {
  # Single-topic runs of every method on every topic, each model (tab:challenger_comparison_llama3b and the per-topic tables).
  for model in "$LLAMA" "$MINISTRAL" "$QWEN"; do
    for t in challenger_disaster salem_witch_trials steve_jobs_medical britney_spears_conservatorship; do
      for m in $METHODS_ALL; do
        train --method "$m" --model "$model" --topics "$t" --out "$RUNS/single/${model##*/}/$t/$m"
        evaluate "$RUNS/single/${model##*/}/$t/$m" --topics "$t"
      done
    done
  done
}

multi_topic() {   # the four topics in one run: $1 = sequential (one stage per topic) or joint (their union)
  for model in "$LLAMA" "$MINISTRAL" "$QWEN"; do
    for m in $METHODS_TOP5; do
      train --method "$m" --model "$model" --topics all --mode "$1" --out "$RUNS/$1/${model##*/}/$m"
      evaluate "$RUNS/$1/${model##*/}/$m"
    done
  done
}
block_sequential() { multi_topic sequential; }   # tab:seq_models and the figure of forget rate across stages
block_joint() { multi_topic joint; }             # tab:comb_models

block_relearn() {
  # Relearning attack on the joint checkpoints: fine-tune on the retain train set, 10 epochs, batch 8,
  # lr 1e-5 / 2e-6 / 5e-6 per model family (losses.HPARAMS "nll", read from the path), then evaluate again.
  for model in "$LLAMA" "$MINISTRAL" "$QWEN"; do
    for m in $METHODS_TOP5; do
      local src=$RUNS/joint/${model##*/}/$m/final
      train --method nll --relearn-set retain_train --model "$src" --topics all --mode joint \
          --out "$RUNS/relearn/${model##*/}/$m"
      evaluate "$RUNS/relearn/${model##*/}/$m"
    done
  done
}

block_ablations() {
  # tab:ablation (Llama, Challenger, lr 3e-6, lambda_f 0.33): design choices, refusal phrasing, data subsets, pairing.
  local base=(--method jensunpp --model "$LLAMA" --topics challenger_disaster)
  train "${base[@]}" --out "$RUNS/ablation/full"
  train "${base[@]}" --no-balance --lr 4e-5 --lambda-f 0.5 --out "$RUNS/ablation/no-balance"
  train "${base[@]}" --no-prefix-targets --out "$RUNS/ablation/no-prefix-targets"
  train "${base[@]}" --no-prefix-mixing --out "$RUNS/ablation/no-delayed-refusal"
  train "${base[@]}" --no-pairing --out "$RUNS/ablation/no-pairing"
  train "${base[@]}" --refusal "I am unable to verify this information." --out "$RUNS/ablation/no-unfortunately"
  train "${base[@]}" --exclude-retain GK --out "$RUNS/ablation/no-gk"
  train "${base[@]}" --exclude-retain Syntax --out "$RUNS/ablation/no-syntax"
  train "${base[@]}" --exclude-retain Lexical --out "$RUNS/ablation/no-lexical"
  for a in full no-balance no-prefix-targets no-delayed-refusal no-pairing no-unfortunately no-gk no-syntax no-lexical; do
    evaluate "$RUNS/ablation/$a" --topics challenger_disaster
    train --method nll --relearn-set retain_train --model "$RUNS/ablation/$a/final" --topics challenger_disaster \
        --lr 1e-5 --out "$RUNS/ablation/$a-relearn"                 # tab:ablation_b_relearn
    evaluate "$RUNS/ablation/$a-relearn" --topics challenger_disaster
  done
}

blocks=("$@")
[ "${blocks[0]}" = "all" ] && blocks=(small sweeps single sequential joint relearn ablations)
for b in "${blocks[@]}"; do
  declare -F "block_$b" >/dev/null || { echo "unknown block: $b"; exit 1; }
  echo "### block $b"
  "block_$b"
done
