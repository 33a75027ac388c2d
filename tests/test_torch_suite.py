"""PyTorch's own optimizer tests (its test/test_optim.py: TestOptimRenewed over every
OptimizerInfo config, and TestDifferentiableOptimizer's gradchecks) pass on funcopt's
classes exactly as they pass on torch.optim's.

The runner lives outside this repository, in ``../shared/torch-tests/run.sh`` (beside
the clone, as CI has it): it runs the tests once against torch.optim and once with
funcopt's classes substituted for torch's, prints the tests whose outcome differs, and
last ``N passed, M failed`` for funcopt. It takes a few minutes, so the test is slow.
Without the runner the test skips, but fails where FUNCOPT_REQUIRE_TORCH_TESTS is set
(.ci/run sets it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import funcopt as fo

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT.parent / "shared" / "torch-tests" / "run.sh"


def torch_optim_classes() -> list[str]:
    """The classes funcopt exports that torch.optim also has: the ones torch's tests cover."""
    return sorted(
        name
        for name in fo.__all__
        if name != "Optimizer"
        and isinstance(getattr(torch.optim, name, None), type)
        and issubclass(getattr(torch.optim, name), torch.optim.Optimizer)
    )


def test_the_selection_is_funcopts_torch_optim_classes():
    classes = torch_optim_classes()
    assert {"Adadelta", "Adagrad", "Adamax", "NAdam"} <= set(classes)
    assert all(issubclass(getattr(fo, name), torch.optim.Optimizer) for name in classes)


@pytest.mark.slow
def test_torch_optimizer_tests_pass_on_funcopt_classes():
    if not RUNNER.exists():
        message = f"torch's optimizer tests are not beside this clone: {RUNNER} is absent"
        if os.environ.get("FUNCOPT_REQUIRE_TORCH_TESTS"):  # set by .ci/run: CI must run them
            pytest.fail(message)
        pytest.skip(message)
    pytest.importorskip("expecttest")  # torch's test utilities need it
    classes = torch_optim_classes()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEER_")}  # no inherited selection
    env |= {"PEER_ALGOS": ",".join(classes), "PEER_RUNS": "torch funcopt"}  # both runs: their diff
    result = subprocess.run(
        ["bash", str(RUNNER), str(ROOT), sys.executable],
        capture_output=True, text=True, env=env, timeout=3600,
    )  # fmt: skip
    out = result.stdout
    report = f"{', '.join(classes)}:\n{out[-6000:]}\n{result.stderr[-2000:]}"
    counts = re.fullmatch(r"(\d+) passed, (\d+) failed", out.strip().splitlines()[-1] if out.strip() else "")
    assert counts, report
    differ = re.search(r"tests whose outcome differs between torch and funcopt: (\d+)", out)
    assert differ, report  # both runs gave results
    assert int(counts[2]) == 0 and int(differ[1]) == 0, report
    print(f"{', '.join(classes)}: {counts[0]}, {differ[0]}")  # shown with pytest -rP
    if len(classes) > 1:  # run.sh then prints each run's counts per class, funcopt's last
        per_class = re.findall(r"per class .*: (.*)", out)[-1]
        passed = dict(re.findall(r"(\w+) (\d+)p/", per_class))
        assert all(int(passed.get(name, 0)) > 0 for name in classes), report  # each class ran
