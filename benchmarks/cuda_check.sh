#!/usr/bin/env bash
# The CUDA checks of issue 65 in one run, for a lent GPU machine (about 9 minutes):
# tests/test_cuda.py, then the CUDA benchmarks, their tables written under $OUT.
#
#   OUT=./cuda_out bash benchmarks/cuda_check.sh
#
# Needs a torch with CUDA already installed (it installs no torch). funcopt runs from
# this checkout (PYTHONPATH); it needs optree, the tests pytest and expecttest: the
# script tries pip for a missing one (--no-deps) and says what is still missing. Each
# part has a time limit (about 8.5 minutes in all); a part that fails or runs out of time
# is reported in $OUT/summary.txt, and the others still run. The exit status is the
# tests' (2: no CUDA torch, 3: the tests could not run). ALL=1 also runs the rest of
# tests/test_cuda.py (about 10 minutes more), then tests/test_fused_horizontal.py's
# cases on the device (fused=True's list graph, compiled for it).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-./cuda_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python}"
DEVICE="${DEVICE:-cuda}"  # DEVICE=cpu ROUNDS=1: a dry run of the script on a machine without a GPU
ROUNDS="${ROUNDS:-}"
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/summary.txt"; }

check='import torch; assert torch.cuda.is_available(), "torch sees no CUDA GPU"'
[ "$DEVICE" = cpu ] && check='import torch'
if ! "$PY" -c "$check" 2>"$OUT/torch_check.txt"; then
    log "no usable torch with CUDA: $(tail -1 "$OUT/torch_check.txt")"
    log "install a CUDA build of torch (pip install torch==2.13.0) and run again"
    exit 2
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0))' \
    | tee -a "$OUT/summary.txt"

# funcopt from this checkout (PYTHONPATH, nothing installed); what it and the tests import
export PYTHONPATH=$PWD
missing=""
for module in optree pytest expecttest; do
    "$PY" -c "import $module" 2>/dev/null && continue
    # (a machine with no network fails here at once: never another torch, --no-deps)
    timeout 60 "$PY" -m pip install -q --no-deps --retries 0 --timeout 5 "$module" >>"$OUT/pip.txt" 2>&1
    "$PY" -c "import $module" 2>/dev/null || missing="$missing $module"
done
if [ -n "$missing" ]; then
    log "missing:$missing (pip install$missing; funcopt needs optree, the tests pytest and expecttest)"
fi

tests=3
if "$PY" -c 'import pytest, expecttest, optree' 2>/dev/null; then
    # issue 65's tests first (-v: each result is in the log even if the time runs out)
    log "tests/test_cuda.py, issue 65's tests (limit 270 s)"
    timeout 270 "$PY" -m pytest tests/test_cuda.py -v -p no:cacheprovider \
        -k "torch_kernels or whole_step_in_a_cuda_graph or reduce_overhead or capturable_step_replays" \
        >"$OUT/test_cuda.txt" 2>&1
    tests=$?
    log "tests: exit $tests; $(tail -1 "$OUT/test_cuda.txt")"
fi

log "fused_step.py --device $DEVICE (limit 80 s)"
timeout 80 "$PY" benchmarks/fused_step.py --device $DEVICE --rounds ${ROUNDS:-10} --algorithms Adam,AdamW,SGD,Adagrad,NAdam \
    --write-table "$OUT/fused_step_cuda.md" >"$OUT/fused_step_cuda.txt" 2>&1
log "fused_step: exit $?"

log "step_time.py --device $DEVICE (limit 70 s)"
timeout 70 "$PY" benchmarks/step_time.py --device $DEVICE --rounds ${ROUNDS:-5} \
    --write-table "$OUT/step_time_cuda.md" >"$OUT/step_time_cuda.txt" 2>&1
log "step_time: exit $?"

log "step_time.py --device $DEVICE --compiled, Adam and SGD (limit 80 s)"
timeout 80 "$PY" benchmarks/step_time.py --device $DEVICE --rounds ${ROUNDS:-5} --algorithms Adam,SGD --compiled \
    --write-table "$OUT/step_time_cuda_compiled.md" >"$OUT/step_time_cuda_compiled.txt" 2>&1
log "step_time --compiled: exit $?"

if [ "${ALL:-0}" = 1 ]; then  # the rest of the CUDA suite: longer than this script's budget
    log "the rest of tests/test_cuda.py (limit 600 s)"
    timeout 600 "$PY" -m pytest tests/test_cuda.py -v -p no:cacheprovider \
        -k "not (torch_kernels or whole_step_in_a_cuda_graph or reduce_overhead or capturable_step_replays)" \
        >"$OUT/test_cuda_rest.txt" 2>&1
    log "rest: exit $?; $(tail -1 "$OUT/test_cuda_rest.txt")"
    log "tests/test_fused_horizontal.py on $DEVICE: the list graph (limit 150 s)"
    timeout 150 "$PY" -m pytest tests/test_fused_horizontal.py -v -p no:cacheprovider -k "$DEVICE" \
        >"$OUT/test_fused_horizontal.txt" 2>&1
    log "fused_horizontal: exit $?; $(tail -1 "$OUT/test_fused_horizontal.txt")"
fi
exit $tests
