#!/usr/bin/env bash
# The paper's experiments as runnable blocks (sections 3-5, appendix B and C).
#
#   ./run_all.sh --dry-run all           # print every command of every block
#   MPS=1 JOBS=12 ./run_all.sh small small_ablations   # the small-scale reproduction on SmolLM2 (one GPU; RESULTS.md)
#   MPS=1 GPUS="0 1 2 3" JOBS=12 ./run_all.sh small   # the same, its side-by-side runs spread over four GPUs
#   NGPU=4 JUDGE_URL=http://127.0.0.1:8000/v1 ./run_all.sh sweeps single
#
# Blocks: small small_ablations proximity lkf_small sweeps single sequential joint relearn ablations lkf. Each block can run alone; the
# blocks after `sweeps` use the paper's selected hyperparameters (losses.HPARAMS), not the sweep's.
# Models are hub ids (a local copy works too). Evaluation uses the LLM judge at $JUDGE_URL (the
# paper's judge is Qwen3.5-35B-A3B, served with vLLM or SGLang); JUDGE=heuristic for a rough offline run.
set -euo pipefail
cd "$(dirname "$0")"

DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
[ $# -ge 1 ] || { sed -n '2,12p' "$0"; exit 1; }

NGPU=${NGPU:-1}
RUNS=${RUNS:-runs}
JUDGE=${JUDGE:-http}
JUDGE_URL=${JUDGE_URL:-http://127.0.0.1:8000/v1}
LLAMA=${LLAMA:-meta-llama/Llama-3.2-3B-Instruct}
MINISTRAL=${MINISTRAL:-mistralai/Ministral-3-3B-Instruct-2512-BF16}
QWEN=${QWEN:-Qwen/Qwen3.5-9B}
METHODS_ALL="graddiff jensun npo pdu rmu satimp simnpo undial wga jensunpp dpo ga"
METHODS_TOP5="graddiff jensun npo pdu jensunpp"        # the five methods of the multi-model tables
# Block small, the small-scale reproduction at the authors' semantics (RESULTS.md, v3): SMALL_METHODS are swept,
# then run sequentially, jointly and attacked by relearning; SMALL_OTHERS get one single-topic run each at their pick.
SMALL_METHODS=${SMALL_METHODS:-"graddiff jensun npo pdu jensunpp dpo"}
SMALL_SEQ_METHODS=${SMALL_SEQ_METHODS:-$SMALL_METHODS}   # block small: those of them run sequentially, jointly, relearned
SMALL_OTHERS=${SMALL_OTHERS:-"rmu satimp simnpo undial wga ga"}
JOBS=${JOBS:-3}                                         # pool lines at a time (see pool)
SMALL_LR_FACTORS=${SMALL_LR_FACTORS:-"3 10 30"}         # block small: multiples of each method's Llama LR
SMALL_PARTS=${SMALL_PARTS:-"inject sweep seq"}          # block small: the parts to run, in order (resumable); also: lambda
SMALL_PROMPT=${SMALL_PROMPT:-chat}                     # block small: answer format (the injection is chat)
# SMALL_EVAL_EXTRA: more evaluate.py flags for the small blocks (a CPU smoke run: --limit 2 --judge rules)
SMALL_EVAL="--judge heuristic --prompt-format $SMALL_PROMPT --batch-size 512 ${MMLU_FILE:+--mmlu-file $MMLU_FILE} ${SMALL_EVAL_EXTRA:-}"
# block small: every training at the authors' loss micro-batch of 4 (relearning: train.py's default of 8, in the
# same global batch of 32), deterministic, so that a rerun of any job gives the same rows (on the same kind of GPU)
SMALL_TRAIN_ARGS=${SMALL_TRAIN_ARGS:---batch-size 4 --deterministic}
SMALL_RELEARN_ARGS=${SMALL_RELEARN_ARGS:---deterministic}
SMALL_INJECT_ARGS=${SMALL_INJECT_ARGS:---lr 1e-4 --epochs 4 --global-batch 16 --batch-size 16}   # block small: the injection
# block small: the loss factors of the LR sweep, those run D's loss-factor sweep picked (RESULTS.md; only JensUn++'s
# left the Llama row); part lambda sweeps them again at the picked LR
declare -A SMALL_LAMBDAS=([jensunpp]="--lambda-f 2")
# block small: GPUS="0 1 2 3" spreads the pool's lines over these GPUs in turn (line i on the i-th, modulo
# their number; $JOBS then counts the lines running on all of them together). Unset: every line on the default GPU.
GPUS=${GPUS:-}
# block small: MPS=1 starts a CUDA MPS daemon for the block (unless one runs), so that the kernels of the
# side-by-side processes overlap instead of taking turns (12 SmolLM2-shaped trainings on an H200: 44.4 -> 73.6
# steps/s together, BENCHMARKS.md).
MPS=${MPS:-0}

run() { echo "+ $*"; if [ $DRY = 0 ]; then "$@"; fi; }
train() { run torchrun --nproc_per_node="$NGPU" train.py --refusal paper "$@"; }   # the paper's refusals; a later --refusal wins
evaluate() { run python evaluate.py "$@" --judge "$JUDGE" --judge-url "$JUDGE_URL"; }

pool() {   # run each line of stdin as a shell command, $JOBS at a time (small models share a GPU; $GPUS in turn)
  # Each command writes its exit status to a file: a status read back from `wait` is lost when bash has
  # already reaped the job (a failing line then let the pool pass, seen in CI).
  local line n=0 gpus=($GPUS) device=() status failed
  status=$(mktemp -d)
  while IFS= read -r line; do
    [ ${#gpus[@]} = 0 ] || device=("CUDA_VISIBLE_DEVICES=${gpus[n % ${#gpus[@]}]}")
    n=$((n + 1))
    echo "+ ${device[*]:+${device[*]} }$line"
    [ $DRY = 1 ] && continue
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
    { rc=0; env OMP_NUM_THREADS=2 "${device[@]}" bash -c "$line" || rc=$?; echo $rc > "$status/$n"; } &
  done
  wait
  failed=$(cat "$status"/* 2>/dev/null | grep -cv '^0$' || true)
  rm -rf "$status"
  [ "$failed" = 0 ] || { echo "pool: $failed command(s) failed, see their .log files"; return 1; }
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
BG_PIDS=""
small_cleanup() {   # on any exit: no evaluation left running behind, no daemon left up
  [ -z "$BG_PIDS" ] || kill $BG_PIDS 2>/dev/null || true
  stop_mps
}
background() {    # run "$@" in the background (its pid in BG_PIDS, waited for by wait_background)
  echo "+ $* &"
  [ $DRY = 1 ] || { "$@" & BG_PIDS+=" $!"; }
}
wait_background() {
  local pid
  for pid in $BG_PIDS; do wait "$pid" || echo "a background evaluation failed (pid $pid), see its .log"; done
  BG_PIDS=""
}

# The lambda sweeps of the paper (tab:llama_hp_alpha), at each method's selected learning rate. JensUn++
# adds lambda_f 2 and 4 (the Ministral table's range, where forgetting kept improving up to 2).
declare -A LAMBDA_SWEEP=([graddiff]="--lambda-r 0.5 --lambda-r 1 --lambda-r 2 --lambda-r 5"
                         [jensun]="--lambda-r 0.25 --lambda-r 0.5 --lambda-r 1 --lambda-r 2"
                         [npo]="--lambda-r 0.5 --lambda-r 1 --lambda-r 3 --lambda-r 5"
                         [pdu]="--lambda-r 0.25 --lambda-r 0.5 --lambda-r 1" [rmu]="--lambda-r 0.25 --lambda-r 1 --lambda-r 3"
                         [satimp]="--lambda-r 0.5 --lambda-r 1 --lambda-r 2" [simnpo]="--lambda-r 0.5 --lambda-r 1 --lambda-r 2"
                         [undial]="--lambda-r 0 --lambda-r 0.25 --lambda-r 1" [wga]="--lambda-r 0.5 --lambda-r 1 --lambda-r 2 --lambda-r 5"
                         [jensunpp]="--lambda-f 0.2 --lambda-f 0.33 --lambda-f 0.5 --lambda-f 1 --lambda-f 2 --lambda-f 4")

small_train() {   # one pool line: train.py with the block's settings into $1, then evaluate it on Challenger
  local d=$1; shift
  # an evaluated run is done (its weights need not be kept: the block can resume from its metrics alone)
  echo "[ -f $d/eval/final/metrics.json ] || { { [ -f $d/final/config.json ] || python train.py --model $SMALL_INJECTED --topics challenger_disaster $* $SMALL_TRAIN_ARGS --print-every 60 --out $d > $d.log 2>&1; } && python evaluate.py $d $SMALL_EVAL --topics challenger_disaster --skip mmlu rep rgq >> $d.log 2>&1; }"
}

picked_flags() {   # the train.py flags (--lr, --lambda-f, --lambda-r) of the run selected in $1 (report.py's .selected)
  if [ $DRY = 1 ]; then echo "--lr LR_OF_$1"; else python report.py flags "$1"; fi
}

block_small() {
  # Small-scale reproduction on one GPU at the authors' settings (RESULTS.md, v3). SmolLM2-135M-Instruct does
  # not know SUITE's facts, so part `inject` first fine-tunes it on every question of the four topics (all
  # forget wordings, train and eval, and the retain rows). On that model, part `sweep` unlearns Challenger
  # with each of $SMALL_METHODS at three learning rates (its Llama LR x $SMALL_LR_FACTORS) and picks by
  # report.py's rule (among runs with Q_All <= 10 and Gib <= 5 the highest Retain); part `seq` runs them
  # sequentially over the four topics and jointly at those picks (run D's, SMALL_PICKS, where the sweep has
  # not picked; a run made at another pick is set aside and made again), attacks the joint models by
  # relearning (the paper's relearning block), and gives each of $SMALL_OTHERS one single-topic run at its
  # pick (SMALL_PICKS), side by side. Heuristic judge; answers in $SMALL_PROMPT format (the injected knowledge
  # is the chat format's).
  # Resumable from the evaluations alone (a finished job is skipped by its metrics; weights need not be kept).
  local out=$RUNS/small m lr d flags
  SMALL_INJECTED=$out/injected/final
  [ $DRY = 1 ] || { trap small_cleanup EXIT; mkdir -p "$out/sweep" "$out/seq"; }
  start_mps
  run python -c "import model; model.smollm2_folder()"      # convert the GGUF once, before several processes read it
  [[ " $SMALL_PARTS " != *" inject "* ]] || small_inject "$out"
  [[ " $SMALL_PARTS " != *" sweep "* ]] || small_sweep "$out"
  [[ " $SMALL_PARTS " != *" lambda "* ]] || small_lambda "$out"
  [[ " $SMALL_PARTS " != *" seq "* ]] || small_seq "$out"
  wait_background
  stop_mps
}

inject() {   # SmolLM2 fine-tuned on the four topics' relearning set $1 (inject or inject_train) into $2
  run python train.py --method nll --relearn-set "$1" --model smollm2 --topics all --mode joint $SMALL_INJECT_ARGS \
      --deterministic --out "$2"
}

small_inject() {   # the injected model; its evaluations and the base model's run beside the next parts
  local out=$1
  [ -f "$out/eval_base/metrics.json" ] || background bash -c "python evaluate.py smollm2 $SMALL_EVAL --skip rgq --out $out/eval_base > $out/eval_base.log 2>&1"
  inject inject "$out/injected"
  [ -f "$out/injected/eval/final/metrics.json" ] || background bash -c "python evaluate.py $out/injected $SMALL_EVAL --skip rgq > $out/injected/eval.log 2>&1"
  # the same knowledge asked in the authors' raw-text format
  [ -f "$out/eval_injected_paper/final/metrics.json" ] || background bash -c "python evaluate.py $out/injected ${SMALL_EVAL/--prompt-format $SMALL_PROMPT/--prompt-format paper} --skip mmlu rep rgq --out $out/eval_injected_paper > $out/eval_injected_paper.log 2>&1"
}

small_sweep() {   # every method at every learning rate side by side (a pool line each), then report.py's picks ($m.selected)
  local out=$1 m lrs lr lr_table
  lr_table=$(python -c "import losses
for m in '$SMALL_METHODS'.split():
    print(m, *('%.2g' % (losses.resolve_hparams(m, 'llama')['lr'] * float(f)) for f in '$SMALL_LR_FACTORS'.split()))")
  while read -r m lrs; do
    for lr in $lrs; do small_train "$out/sweep/$m-lr$lr" --method "$m" --lr "$lr" ${SMALL_LAMBDAS[$m]:-}; done
  done <<< "$lr_table" | pool || echo "the block goes on with the runs that finished"
  for m in $SMALL_METHODS; do
    run python report.py table "$out/sweep/$m.md" "$out"/sweep/$m-lr*/eval/final || echo "no pick for $m: none of its runs finished"
  done
}

llama_row() {   # "METHOD--FLAG VALUE" lines: every method's Llama-row --lr, --lambda-f and --lambda-r (%g)
  python -c "import losses
for m in losses.METHODS:
    h = losses.resolve_hparams(m, 'llama')
    print(m + '--lr', '%g' % h['lr']); print(m + '--lambda-f', '%g' % h['lambda_f']); print(m + '--lambda-r', '%g' % h['lambda_r'])"
}

small_lambda() {   # optional: at each picked LR, every loss factor the paper swept; then the pick again
  local out=$1 m lr line flags
  local -A default=()               # the LR sweep's own loss factors (the Llama row's, or SMALL_LAMBDAS')
  while read -r key value; do default[$key]=$value; done < <(llama_row)
  for m in "${!SMALL_LAMBDAS[@]}"; do
    set -- ${SMALL_LAMBDAS[$m]}
    while [ $# -gt 0 ]; do default[$m$1]=$(printf '%g' "$2"); shift 2; done
  done
  for m in $SMALL_METHODS; do
    flags=$(picked_flags "$out/sweep/$m.selected") || continue
    lr=${flags#--lr }; lr=${lr%% *}
    line=""
    set -- ${LAMBDA_SWEEP[$m]:-}
    while [ $# -gt 0 ]; do
      [ "$(printf '%g' "$2")" = "${default[$m$1]}" ] || line+="{ $(small_train "$out/sweep/$m-lr$lr${1#--}$2" --method "$m" --lr "$lr" "$1" "$2"); } & "
      shift 2
    done
    # every factor's status (a bare wait returns 0 whatever failed), the table (the pick again) in any case
    echo "${line}st=0; for p in \$(jobs -p); do wait \$p || st=1; done; python report.py table $out/sweep/$m.md $out/sweep/$m-lr*/eval/final > /dev/null; exit \$st"
  done | pool || echo "the block goes on with the methods that finished"
}

set_aside_if_stale() {   # run folder $1, trained at other settings than train.py flags $2.. (a changed pick), -> $1.stale
  local d=$1; shift
  [ $DRY = 0 ] && [ -f "$d/config.json" ] || return 1
  [ "$(python -c "import json, sys
trained = json.load(open(sys.argv[1]))['hparams']
asked = {k[2:].replace('-', '_'): float(v) for k, v in zip(sys.argv[2::2], sys.argv[3::2])}
print(any(abs(trained[k] - v) > 1e-9 * v for k, v in asked.items()))" "$d/config.json" "$@")" = True ] || return 1
  echo "$d: trained at other settings than $*, set aside as $d.stale"
  rm -rf "$d.stale"; mv "$d" "$d.stale"
}

small_seq() {   # sequential, joint and relearning runs at the picks, and the other methods' single runs, side by side
  local out=$1 m d flags lr lrs="" relearn_lr=HIGHEST_PICKED_LR seqs="" joints="" relearns=""
  local -A picked=()
  for m in $SMALL_METHODS; do    # the sweep's pick, or run D's (SMALL_PICKS) where the sweep has not picked (yet)
    [ -f "$out/sweep/$m.selected" ] || echo "block small: no pick of the sweep for $m, run D's: ${SMALL_PICKS[$m]}" >&2
    flags=$(small_pick "$m") || continue
    picked[$m]=$flags; lr=${flags#--lr }; lrs+=" ${lr%% *}"
  done
  # The relearning attack's LR, by the paper's rule (appendix, relearning): at least the highest LR of the
  # unlearning methods attacked (its 1e-5 for Llama; SmolLM2's picks are 3-30x the Llama LRs).
  [ $DRY = 1 ] || relearn_lr=$(python -c "import sys; print('%g' % max(map(float, sys.argv[1:] + ['1e-5'])))" $lrs)
  {
    for m in $SMALL_SEQ_METHODS; do
      [ -n "${picked[$m]:-}" ] || continue
      flags="${picked[$m]} $SMALL_TRAIN_ARGS --print-every 60"
      d=$out/seq/$m
      set_aside_if_stale "$d-sequential" ${picked[$m]} >&2 || true
      if set_aside_if_stale "$d-joint" ${picked[$m]} >&2; then rm -rf "$d-relearn"
      else set_aside_if_stale "$d-relearn" --lr "$relearn_lr" >&2 || true; fi
      echo "[ -f $d-sequential/eval/stages.md ] || { python train.py --method $m --model $SMALL_INJECTED --topics all --mode sequential $flags --out $d-sequential > $d-sequential.log 2>&1 && python evaluate.py $d-sequential $SMALL_EVAL --skip mmlu rep rgq >> $d-sequential.log 2>&1; }"
      echo "[ -f $d-relearn/eval/final/metrics.json ] || { { [ -f $d-joint/final/config.json ] || python train.py --method $m --model $SMALL_INJECTED --topics all --mode joint $flags --out $d-joint > $d-joint.log 2>&1; } && { [ -f $d-joint/eval/final/metrics.json ] || python evaluate.py $d-joint $SMALL_EVAL --skip mmlu rep rgq >> $d-joint.log 2>&1; } && python train.py --method nll --relearn-set retain_train --model $d-joint/final --topics all --mode joint --lr $relearn_lr $SMALL_RELEARN_ARGS --print-every 60 --out $d-relearn > $d-relearn.log 2>&1 && python evaluate.py $d-relearn $SMALL_EVAL --skip mmlu rep rgq >> $d-relearn.log 2>&1; }"
    done
    for m in $SMALL_OTHERS; do
      flags=${SMALL_PICKS[$m]}; lr=${flags#--lr }; lr=${lr%% *}
      echo "{ $(small_train "$out/sweep/$m-lr$lr" --method "$m" $flags); } && python report.py table $out/sweep/$m.md $out/sweep/$m-lr*/eval/final > /dev/null"
    done
  } | pool || echo "the tables hold the runs that finished"
  for m in $SMALL_SEQ_METHODS; do
    seqs+=" $m=$out/seq/$m-sequential/eval"; joints+=" $m=$out/seq/$m-joint/eval/final"
    relearns+=" $m=$out/seq/$m-joint/eval/final,$out/seq/$m-relearn/eval/final"
  done
  small_tables "$out" "$seqs" "$joints" "$relearns"
}

small_tables() {   # the block's tables, from the evaluations alone (an unpacked archive rebuilds them)
  local out=$1
  run python report.py table "$out/results.md" base="$out/eval_base" injected="$out/injected/eval/final" \
      $(ls -d "$out"/sweep/*/eval/final 2>/dev/null || echo "$out/sweep/METHOD-lrLR/eval/final") || echo "no results table"
  run python report.py stages "$out/sequential.md" $2 --joint $3 || echo "no sequential table"
  run python report.py relearn "$out/relearn.md" $4 || echo "no relearning table"
}

# block small_ablations: controlled ablations of block small's sequential JensUn++ (RESULTS.md, v3), one change
# each, every other setting its pick's; the baseline is block small's own run. batch32: one loss micro-batch of 32
# a step (run D's setting); lr_third: a third of the picked LR; seen_retain: each stage's retain term over the
# retain sets of every topic seen so far (--retain-scope seen); inject_train: the model injected with the
# training files only (--relearn-set inject_train), so that evaluation asks wordings it never trained on.
SMALL_ABLATIONS=${SMALL_ABLATIONS:-"batch32 lr_third seen_retain inject_train"}
SMALL_ABL_PARTS=${SMALL_ABL_PARTS:-"inject runs"}

block_small_ablations() {
  local out=$RUNS/small a d flags lr third line evals="base=$RUNS/small/seq/jensunpp-sequential/eval"
  [ $DRY = 1 ] || { trap small_cleanup EXIT; mkdir -p "$out/ablation"; }
  start_mps
  if [[ " $SMALL_ABL_PARTS " == *" inject "* ]]; then
    d=$out/injected_train
    inject inject_train "$d"
    run python evaluate.py "$d" $SMALL_EVAL --skip mmlu rep rgq
  fi
  if [[ " $SMALL_ABL_PARTS " == *" runs "* ]]; then
    flags=$(small_pick jensunpp)
    lr=${flags#--lr }; lr=${lr%% *}
    third=LR_THIRD
    [ $DRY = 1 ] || third=$(python -c "print('%.3g' % ($lr / 3))")
    for a in $SMALL_ABLATIONS; do
      d=$out/ablation/jensunpp-$a
      case $a in
        batch32) line="--model $out/injected/final $flags $SMALL_TRAIN_ARGS --batch-size 32" ;;
        lr_third) line="--model $out/injected/final ${flags/--lr $lr/--lr $third} $SMALL_TRAIN_ARGS" ;;
        seen_retain) line="--model $out/injected/final $flags $SMALL_TRAIN_ARGS --retain-scope seen" ;;
        inject_train) line="--model $out/injected_train/final $flags $SMALL_TRAIN_ARGS" ;;
        *) echo "block small_ablations: unknown ablation '$a'"; return 1 ;;
      esac
      echo "[ -f $d/eval/stages.md ] || { python train.py --method jensunpp --topics all --mode sequential $line --print-every 60 --out $d > $d.log 2>&1 && python evaluate.py $d $SMALL_EVAL --skip mmlu rep rgq >> $d.log 2>&1; }"
    done | pool || echo "the table holds the ablations that finished"
    for a in $SMALL_ABLATIONS; do evals+=" $a=$out/ablation/jensunpp-$a/eval"; done
    run python report.py stages "$out/ablations.md" $evals
  fi
  stop_mps
}

# block proximity: the unlearning methods and the relearning arms (train.py
# --relearn-set; nearest to farthest from the forget topic); the methods start from their SMALL_PICKS.
PROX_METHODS=${PROX_METHODS:-"jensunpp dpo npo"}
PROX_ARMS=${PROX_ARMS:-"forget_train forget:K1-K5 tiers:0 tiers:1-2 tiers:3-4 tiers:5-6 tiers:7-8 tiers:9-10 tiers:11-12 tiers:13-14 lexical syntax gk retain_train"}
SMALL_MODEL=${SMALL_MODEL:-$RUNS/small/injected/final}      # blocks proximity and lkf_small: block small's injected SmolLM2
# The picks of block small on the injected SmolLM2 (RESULTS.md, run D, Challenger): blocks proximity and lkf_small
# start from them (a pick that block small's sweep selected in $RUNS/small/sweep/M.selected wins).
declare -A SMALL_PICKS=([jensunpp]="--lr 9e-05 --lambda-f 2 --lambda-r 1" [dpo]="--lr 3e-05 --lambda-f 1 --lambda-r 1"
                        [npo]="--lr 8e-05 --lambda-f 1 --lambda-r 3" [graddiff]="--lr 1.5e-05 --lambda-f 1 --lambda-r 2"
                        [jensun]="--lr 5e-05 --lambda-f 1 --lambda-r 1" [pdu]="--lr 3e-05 --lambda-f 1 --lambda-r 1"
                        [rmu]="--lr 0.0003 --lambda-f 0.5 --lambda-r 0.25" [satimp]="--lr 3e-05 --lambda-f 0.1 --lambda-r 1"
                        [simnpo]="--lr 0.0003 --lambda-f 0.125 --lambda-r 0.5" [undial]="--lr 0.0003 --lambda-f 1 --lambda-r 0"
                        [wga]="--lr 8e-05 --lambda-f 1 --lambda-r 1" [ga]="--lr 1.5e-06 --lambda-f 1 --lambda-r 0")
small_pick() {   # the train.py flags of method $1's pick on the injected SmolLM2
  if [ -f "$RUNS/small/sweep/$1.selected" ]; then picked_flags "$RUNS/small/sweep/$1.selected"; else echo "${SMALL_PICKS[$1]:-}"; fi
}

block_proximity() {
  # Relearning by semantic proximity (ours; RESULTS.md): does forgotten knowledge come back in proportion to
  # how close the attacker's data is to the forget topic? Each method unlearns Challenger on the injected
  # SmolLM2 at its pick; from that one checkpoint every arm fine-tunes independently (NLL, 10 epochs of 450
  # draws from its band: the same 150 steps as the paper's attack, at the paper's relearning rule's LR,
  # the highest picked), then is read out on the forget questions (on the facts it did not train on), with
  # the forget answers' NLL against the unlearned model. Heuristic judge, chat format; resumable.
  local out=$RUNS/proximity m d a arm lrs="" relearn_lr evals=""
  local eval_args="--judge heuristic --prompt-format $SMALL_PROMPT --batch-size 256 --topics challenger_disaster"
  [ $DRY = 1 ] || [ -f "$SMALL_MODEL/config.json" ] || { echo "block proximity: no model at $SMALL_MODEL (run block small's part inject, or set SMALL_MODEL)"; return 1; }
  [ $DRY = 1 ] || { trap small_cleanup EXIT; mkdir -p "$out"; }
  local -A picks=()
  for m in $PROX_METHODS; do
    picks[$m]=$(small_pick "$m")
    [ -n "${picks[$m]}" ] || { echo "block proximity: no pick for $m (SMALL_PICKS)"; return 1; }
    lr=${picks[$m]#--lr }; lrs+=" ${lr%% *}"
  done
  relearn_lr=$(python -c "import sys; print('%g' % max(map(float, sys.argv[1:])))" $lrs)
  start_mps
  for m in $PROX_METHODS; do        # the unlearned models, side by side
    d=$out/$m
    echo "[ -f $d/eval/final/metrics.json ] || { python train.py --method $m --model $SMALL_MODEL --topics challenger_disaster ${picks[$m]} $SMALL_TRAIN_ARGS --print-every 60 --out $d > $d.log 2>&1 && python evaluate.py $d $eval_args --skip mmlu rep rgq >> $d.log 2>&1; }"
  done | pool || echo "the arms start from the methods that finished"
  for m in $PROX_METHODS; do        # every arm from its method's unlearned checkpoint, independently
    d=$out/$m
    for arm in $PROX_ARMS; do
      a=$out/$m-${arm//:/-}
      echo "[ -f $a/eval/final/metrics.json ] || { python train.py --method nll --relearn-set $arm --model $d/final --topics challenger_disaster --lr $relearn_lr $SMALL_TRAIN_ARGS --print-every 60 --out $a > $a.log 2>&1 && python evaluate.py $a $eval_args --sets forget --skip mmlu rep rgq --base $d/final --base-eval $d/eval/final >> $a.log 2>&1; }"
    done
  done | pool || echo "the table holds the arms that finished"
  for m in $PROX_METHODS; do evals+=" $m=$out/$m/eval/final"; for arm in $PROX_ARMS; do evals+=" $out/$m-${arm//:/-}/eval/final"; done; done
  run python report.py proximity "$out/proximity.md" $evals
  stop_mps
}

LKF_METHODS=${LKF_METHODS:-"graddiff jensun npo pdu rmu jensunpp"}     # blocks lkf and lkf_small

block_lkf() {
  # The paper's LKF* experiment on Llama, Challenger (tab:challenger_combined_expand_llama3b and
  # tab:challenger_comparison_llama3b, appendix "Benign questions"): each method trained on LKF* (data/lkf,
  # `suite.py lkf`; --recipe lkf: 10 epochs, random pairs, the LKF* table's hyperparameters) and on SUITE; the
  # LKF*-trained models evaluated with both protocols (LKF*'s with the lexical 'Challenger' probe).
  local out=$RUNS/lkf m args=""
  run python suite.py validate --data-root data/lkf
  evaluate "$LLAMA" --topics challenger_disaster --out "$out/base/eval/final"
  evaluate "$LLAMA" --protocol lkf --out "$out/base/eval_lkf/final"
  for m in $LKF_METHODS; do
    train --method "$m" --model "$LLAMA" --recipe lkf --out "$out/$m-lkf"
    evaluate "$out/$m-lkf" --protocol lkf
    evaluate "$out/$m-lkf" --topics challenger_disaster
    train --method "$m" --model "$LLAMA" --topics challenger_disaster --out "$out/$m-suite"
    evaluate "$out/$m-suite" --topics challenger_disaster
    args+=" $m=$out/$m-lkf/eval_lkf/final,$out/$m-lkf/eval/final,$out/$m-suite/eval/final"
  done
  run python report.py lkf "$out/tables.md" "base=$out/base/eval_lkf/final,$out/base/eval/final,$out/base/eval/final" $args
}

lkf_small_flags() {   # "METHOD FLAGS" for each METHOD=PICKED_LR: LKF* flags on the injected SmolLM2, the LKF* table's
  # loss factors and its LR scaled by the pick's factor over SUITE's (one python for all: each import of torch costs seconds)
  python -c "import losses, sys
for arg in sys.argv[1:]:
    m, pick = arg.split('=')
    suite, lkf = losses.resolve_hparams(m, 'llama'), losses.resolve_hparams(m, 'llama', 'lkf')
    print(m, '--lr %.2g --lambda-f %g --lambda-r %g' % (float(pick) * lkf['lr'] / suite['lr'], lkf['lambda_f'], lkf['lambda_r']))" "$@"
}

block_lkf_small() {
  # The LKF* experiment at small scale: block lkf's runs on the injected SmolLM2 ($SMALL_MODEL), heuristic judge,
  # chat format, side by side ($JOBS, $GPUS). SUITE-trained runs use the method's pick (SMALL_PICKS); LKF*-trained
  # ones the LKF* table's loss factors and its learning rate times the pick's factor over the SUITE table's LR
  # (the paper tuned each dataset apart; this carries its LKF*/SUITE ratio over to the small model).
  local out=$RUNS/lkf_small m pick lr args="" picked_lrs=""
  local -A pick_of=() lkf_flags=()
  local eval_args="--judge heuristic --prompt-format $SMALL_PROMPT --batch-size 256 --skip mmlu rep rgq"
  [ $DRY = 1 ] || [ -f "$SMALL_MODEL/config.json" ] || { echo "block lkf_small: no model at $SMALL_MODEL (run block small's part inject, or set SMALL_MODEL)"; return 1; }
  [ $DRY = 1 ] || { trap small_cleanup EXIT; mkdir -p "$out"; }
  for m in $LKF_METHODS; do
    pick_of[$m]=$(small_pick "$m"); lr=${pick_of[$m]#--lr }; picked_lrs+=" $m=${lr%% *}"
  done
  while read -r m flags; do lkf_flags[$m]=$flags; done < <(lkf_small_flags $picked_lrs)
  start_mps
  {
    echo "{ { [ -f $out/base/eval_lkf/final/metrics.json ] || python evaluate.py $SMALL_MODEL $eval_args --protocol lkf --out $out/base/eval_lkf/final; } && { [ -f $out/base/eval/final/metrics.json ] || python evaluate.py $SMALL_MODEL $eval_args --topics challenger_disaster --out $out/base/eval/final; }; } >> $out/base.log 2>&1"
    for m in $LKF_METHODS; do
      pick=${pick_of[$m]}
      echo "[ -f $out/$m-lkf/eval/final/metrics.json ] || { python train.py --method $m --model $SMALL_MODEL --recipe lkf ${lkf_flags[$m]} $SMALL_TRAIN_ARGS --print-every 60 --out $out/$m-lkf && python evaluate.py $out/$m-lkf $eval_args --protocol lkf && python evaluate.py $out/$m-lkf $eval_args --topics challenger_disaster; } > $out/$m-lkf.log 2>&1"
      echo "[ -f $out/$m-suite/eval/final/metrics.json ] || { python train.py --method $m --model $SMALL_MODEL --topics challenger_disaster $pick $SMALL_TRAIN_ARGS --print-every 60 --out $out/$m-suite && python evaluate.py $out/$m-suite $eval_args --topics challenger_disaster; } > $out/$m-suite.log 2>&1"
    done
  } | pool || echo "the tables hold the runs that finished"
  for m in $LKF_METHODS; do args+=" $m=$out/$m-lkf/eval_lkf/final,$out/$m-lkf/eval/final,$out/$m-suite/eval/final"; done
  run python report.py lkf "$out/tables.md" "injected=$out/base/eval_lkf/final,$out/base/eval/final,$out/base/eval/final" $args
  stop_mps
}

block_sweeps() {
  # Appendix tables tab:llama_hp_lr and tab:llama_hp_alpha: LR sweep, then lambda sweep, on Challenger with Llama.
  local -A LRS=([graddiff]="3e-7 4e-7 5e-7 1e-6" [jensun]="2e-6 4e-6 5e-6 8e-6" [npo]="5e-6 8e-6 1e-5 2e-5"
                [pdu]="1e-6 3e-6 5e-6 8e-6" [rmu]="3e-5 7e-5 1e-4 3e-4" [satimp]="7e-6 8e-6 1e-5 3e-5"
                [simnpo]="7e-6 1e-5 2e-5 3e-5" [undial]="5e-5 1e-4 5e-4" [wga]="5e-6 8e-6 1e-5 2e-5"
                [jensunpp]="1e-6 2e-6 3e-6 4e-6")
  local -A default=()      # the Llama row's LR and loss factors: its run in the LR sweep is the lambda sweep's default
  while read -r key value; do default[$key]=$value; done < <(llama_row)
  for m in "${!LRS[@]}"; do
    for lr in ${LRS[$m]}; do
      train --method "$m" --model "$LLAMA" --topics challenger_disaster --lr "$lr" --out "$RUNS/sweep/$m-lr$lr"
      evaluate "$RUNS/sweep/$m-lr$lr" --topics challenger_disaster
    done
    set -- ${LAMBDA_SWEEP[$m]}
    while [ $# -gt 0 ]; do
      if [[ " $(printf '%g ' ${LRS[$m]})" == *" ${default[$m--lr]} "* ]] && [ "$(printf '%g' "$2")" = "${default[$m$1]}" ]; then
        shift 2; continue     # the LR sweep's run at the Llama row's LR has this factor already
      fi
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
  # Relearning attack on the joint checkpoints: fine-tune on the retain train set, 10 epochs, 32 pairs a step in
  # loss micro-batches of 8 (train.py's relearning defaults), lr 1e-5 / 2e-6 / 5e-6 per model family
  # (losses.HPARAMS "nll", read from the path), then evaluate again.
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
[ "${blocks[0]}" = "all" ] && blocks=(small small_ablations proximity lkf_small sweeps single sequential joint relearn ablations lkf)
for b in "${blocks[@]}"; do
  declare -F "block_$b" >/dev/null || { echo "unknown block: $b"; exit 1; }
  echo "### block $b"
  "block_$b"
done
