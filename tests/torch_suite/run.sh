#!/usr/bin/env bash
# PyTorch's own optimizer tests (TestOptimRenewed + TestDifferentiableOptimizer) run twice on
# the CPU: once against torch.optim (reference), once with funcopt's classes substituted for
# torch's (see _peer_plugin.py). tests/test_torch_suite.py runs this; to run it by hand:
#
#   bash tests/torch_suite/run.sh TORCH_TESTS /path/to/funcopt/checkout /path/to/python
#
# TORCH_TESTS: PyTorch's test/ folder at the tag of the installed torch (it holds test_optim.py
# and optim/test_optim.py; the README says how to get it). Only those two files are used: they
# are copied into a temporary folder and run there, away from PyTorch's conftest.py and
# pytest.ini, which need PyTorch's own CI set-up.
# PEER_ALGOS: unset = Adadelta / Adagrad / Adamax / NAdam; "all" = every torch.optim class the
# contract names (15); or a comma-separated list of class names. A selected class funcopt lacks
# counts as failures of all its selected tests (skips stay skips).
# The python needs torch, pytest, expecttest and optree; this installs nothing.
# PEER_RUNS=funcopt (or torch) runs only that side. PEER_PYTEST_ARGS adds pytest arguments.
# PEER_DYNAMO=1 runs the same selection the way PyTorch's CI "dynamo-wrapped" shards do
# (PYTORCH_TEST_WITH_DYNAMO=1: each test body runs under torch._dynamo).
# The last line printed is funcopt's "N passed, M failed" (errors count as failed; skipped
# tests are counted apart: they are the GPU-only tests, skipped in the reference run too).
set -u
USAGE="usage: run.sh TORCH_TESTS /path/to/checkout [python]"
TESTS="${1:?$USAGE}"
CHECKOUT="${2:?$USAGE}"
PY="${3:-python}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CHECKOUT="$(cd "$CHECKOUT" && pwd)" || { echo "no such checkout: $2"; echo "0 passed, 1 failed"; exit 2; }
for f in test_optim.py optim/test_optim.py; do
    if [ ! -f "$TESTS/$f" ]; then
        echo "ERROR: $TESTS/$f is absent: TORCH_TESTS must be PyTorch's test/ folder"
        echo "0 passed, 1 failed"; exit 2
    fi
done
RUNS="${PEER_RUNS:-torch funcopt}"
if [ "${PEER_DYNAMO:-0}" = 1 ]; then export PYTORCH_TEST_WITH_DYNAMO=1 PYTORCH_PRINT_REPRO_ON_FAILURE=0; fi

export PYTHONPATH="$HERE:$CHECKOUT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
if ! "$PY" -c "import torch, pytest, expecttest, optree" 2>/dev/null; then
    echo "ERROR: '$PY' lacks torch/pytest/expecttest/optree (this runner installs nothing)"
    echo "0 passed, 1 failed"; exit 2
fi
"$PY" -c "import torch, funcopt; print('torch', torch.__version__, '| funcopt from', funcopt.__file__)" || {
    echo "0 passed, 1 failed"; exit 1; }

TMP="$(mktemp -d "${TMPDIR:-/tmp}/peer_torch_test_optim.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/tests/optim"
cp "$TESTS/test_optim.py" "$TMP/tests/test_optim.py"
cp "$TESTS/optim/test_optim.py" "$TMP/tests/optim/test_optim.py"
printf '[pytest]\n' > "$TMP/tests/pytest.ini"  # this folder is the root: no outer config applies
cd "$TMP/tests"
for impl in $RUNS; do
    echo "=== PEER_IMPL=$impl ==="
    # shellcheck disable=SC2086
    PEER_IMPL="$impl" PEER_RESULTS="$TMP/$impl.json" timeout "${PEER_TIMEOUT:-3000}" "$PY" -m pytest \
        -c pytest.ini -p _peer_plugin -p no:cacheprovider -p no:logging -q -rfE --tb=short ${PEER_PYTEST_ARGS:-} test_optim.py \
        2>&1 | grep -v -e "PytestUnknownMarkWarning" -e "return pytest.mark.serial" | grep -e "^FAILED" -e "^ERROR" -e " passed" -e " failed" | tail -n 300
done

"$PY" "$HERE/summary.py" "$TMP" $RUNS
