#!/usr/bin/env bash
# specc-tiny v2 (examples/train_tiny.py --preset v2) in two GPU calls of at most 10 minutes each.
#
#   bash examples/train_tiny_v2.sh 1   # corpus, tokenizer, target, distillation data
#   bash examples/train_tiny_v2.sh 2   # corpus, tokenizer, restore call 1's results, PARD, DFlash, eval
#
# Each call ends by exporting the workdir's results to $OUT as tiny-export.tar.part-NN (the
# models in bf12; parts of at most 15 MiB) and its log to $OUT/train-N.log, also when the
# training was stopped by the time limit (stages that finished are kept and exported).
# Call 2 reuses the workdir if call 1 ran on this same machine; otherwise it restores call 1's
# export from $TINY_RESTORE (default .tiny2: the parts, carried there by the caller), or a
# folder of model directories (TINY_RESTORE=specc/zoo: continue from the shipped family, e.g.
# TINY_STAGES=dflash,eval with --set dflash_resume=true to train the shipped DFlash further).
# TINY_STAGES (call 2's stages, default pard,dflash,eval; "eval" re-evaluates a restored family),
# TINY_PRESET / TINY_WORKDIR / TINY_LIMIT and extra arguments (passed to every train_tiny.py
# run, e.g. --source-dir DIR) let the tests run the same two calls at toy scale on a CPU.
set -u -o pipefail
call=${1:?usage: train_tiny_v2.sh 1|2 [train_tiny.py arguments]}
shift
out=${OUT:?set OUT to the output folder}
work=${TINY_WORKDIR:-/tmp/tiny2}
preset=${TINY_PRESET:-v2}
limit=${TINY_LIMIT:-530}
restore=${TINY_RESTORE:-.tiny2}
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
mkdir -p "$out"
logf="$out/train-$call.log"
train() { python3 examples/train_tiny.py --workdir "$work" "$@" 2>&1 | tee -a "$logf"; }
start=$(date +%s)
case "$call" in
  1)
    timeout "$limit" python3 examples/train_tiny.py --workdir "$work" --preset "$preset" \
      --stage corpus,tokenizer,target,distill "$@" 2>&1 | tee -a "$logf"
    ;;
  2)
    if [ ! -f "$work/models/specc-tiny/model.safetensors" ]; then
      train --preset "$preset" --stage corpus,tokenizer,restore --restore-dir "$restore" "$@" || exit 1
    fi
    left=$(( limit - ($(date +%s) - start) ))
    timeout "$left" python3 examples/train_tiny.py --workdir "$work" --stage "${TINY_STAGES:-pard,dflash,eval}" "$@" 2>&1 | tee -a "$logf"
    ;;
  *) echo "train_tiny_v2.sh: call must be 1 or 2, not $call" >&2; exit 2 ;;
esac
status=$?
# call 2's export is the whole family; it leaves out the distillation data (no later call needs it)
keep_distill=true; [ "$call" = 2 ] && keep_distill=false
train --stage export --export-dir "$out" --set export_distill=$keep_distill "$@"
echo "train_tiny_v2.sh: call $call training exit status $status, $(( $(date +%s) - start ))s in all" | tee -a "$logf"
exit $status
