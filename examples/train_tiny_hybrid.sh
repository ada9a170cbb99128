#!/usr/bin/env bash
# specc-tiny-hybrid (examples/train_tiny.py --preset hybrid) in ONE GPU call of at most 10 minutes:
#
#   bash examples/train_tiny_hybrid.sh   # corpus, tokenizer, target, distillation data, DFlash, eval
#
# The call ends by exporting the family to $OUT as tiny-export.tar.part-NN (the models in bf12,
# no distillation data) and its log to $OUT/train-hybrid.log, also when the training was stopped
# by the time limit (stages that finished are kept and exported).
# TINY_PRESET (default hybrid), TINY_WORKDIR, TINY_LIMIT (seconds of training before the export)
# and extra arguments (passed to every train_tiny.py run, e.g. --source-dir DIR) let the tests run
# the same call at toy scale on a CPU (TINY_PRESET=hybrid-toy).
set -u -o pipefail
out=${OUT:?set OUT to the output folder}
work=${TINY_WORKDIR:-/tmp/tiny-hybrid}
preset=${TINY_PRESET:-hybrid}
limit=${TINY_LIMIT:-530}
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
mkdir -p "$out"
logf="$out/train-hybrid.log"
start=$(date +%s)
timeout "$limit" python3 examples/train_tiny.py --workdir "$work" --preset "$preset" \
  --stage corpus,tokenizer,target,distill,dflash,eval "$@" 2>&1 | tee -a "$logf"
status=$?
python3 examples/train_tiny.py --workdir "$work" --stage export --export-dir "$out" \
  --set export_distill=false "$@" 2>&1 | tee -a "$logf"
echo "train_tiny_hybrid.sh: training exit status $status, $(( $(date +%s) - start ))s in all" | tee -a "$logf"
exit $status
