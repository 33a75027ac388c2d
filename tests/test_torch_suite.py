"""PyTorch's own optimizer tests (its test/test_optim.py: TestOptimRenewed over every
OptimizerInfo config, and TestDifferentiableOptimizer's gradchecks) pass on funcopt's
classes exactly as they pass on torch.optim's.

The tests are PyTorch's, not in this repository: FUNCOPT_TORCH_TESTS names PyTorch's
``test/`` folder at the tag of the installed torch (the README says how to get it; by
default ``../shared/torch-tests`` beside the clone, where CI keeps a copy). The runner,
``tests/torch_suite/run.sh``, runs them once against torch.optim and once with
funcopt's classes substituted for torch's, prints the tests whose outcome differs, and
last ``N passed, M failed`` for funcopt. It takes a few minutes, so the test is slow.
Without the tests it skips, and the run's summary says so (tests/conftest.py), but it
fails where FUNCOPT_REQUIRE_TORCH_TESTS is set (.ci/run sets it).
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
RUNNER = ROOT / "tests" / "torch_suite" / "run.sh"
DEFAULT_TESTS = ROOT.parent / "shared" / "torch-tests"
HOW = (
    "see 'Tests' in the README: a sparse checkout of PyTorch's test/ folder at the tag of the installed torch"
)


def torch_tests_folder() -> tuple[Path | None, str]:
    """The folder holding PyTorch's test_optim.py, or None and why there is none.

    FUNCOPT_TORCH_TESTS names PyTorch's test/ folder, or a folder whose ``upstream/``
    is a copy of it (as ../shared/torch-tests keeps it). A value that names neither is
    an error, not a skip: it was set to be used. Unset, ../shared/torch-tests is used
    where it exists."""
    value = os.environ.get("FUNCOPT_TORCH_TESTS")
    folder = Path(value) if value else DEFAULT_TESTS
    for candidate in (folder, folder / "upstream"):
        if (candidate / "test_optim.py").is_file() and (candidate / "optim" / "test_optim.py").is_file():
            return candidate.resolve(), ""
    if value:
        pytest.fail(
            f"FUNCOPT_TORCH_TESTS={value!r} holds no test_optim.py and optim/test_optim.py: "
            f"it must name PyTorch's test/ folder ({HOW})"
        )
    return None, f"FUNCOPT_TORCH_TESTS is not set and {DEFAULT_TESTS} is absent ({HOW})"


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
    tests, why_not = torch_tests_folder()
    if tests is None:
        message = f"PyTorch's optimizer tests were not run: {why_not}"
        if os.environ.get("FUNCOPT_REQUIRE_TORCH_TESTS"):  # set by .ci/run: CI must run them
            pytest.fail(message)
        pytest.skip(message)
    pytest.importorskip("expecttest")  # torch's test utilities need it
    classes = torch_optim_classes()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEER_")}  # no inherited selection
    env |= {"PEER_ALGOS": ",".join(classes), "PEER_RUNS": "torch funcopt"}  # both runs: their diff
    result = subprocess.run(
        ["bash", str(RUNNER), str(tests), str(ROOT), sys.executable],
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


def pytorch_test_folder(path: Path) -> Path:
    """A folder laid out as PyTorch's test/ is, as far as the runner reads it."""
    (path / "optim").mkdir(parents=True)
    (path / "test_optim.py").write_text("")
    (path / "optim" / "test_optim.py").write_text("")
    return path


def test_the_tests_folder_is_read_from_the_environment(tmp_path, monkeypatch):
    torch_test = pytorch_test_folder(tmp_path / "pytorch" / "test")
    monkeypatch.setenv("FUNCOPT_TORCH_TESTS", str(torch_test))
    assert torch_tests_folder() == (torch_test.resolve(), "")
    shared = pytorch_test_folder(tmp_path / "shared" / "upstream").parent  # ../shared/torch-tests' layout
    monkeypatch.setenv("FUNCOPT_TORCH_TESTS", str(shared))
    assert torch_tests_folder() == ((shared / "upstream").resolve(), "")


def test_a_tests_folder_that_is_not_one_fails(tmp_path, monkeypatch):
    (tmp_path / "test_optim.py").write_text("")  # optim/test_optim.py is missing
    monkeypatch.setenv("FUNCOPT_TORCH_TESTS", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match="FUNCOPT_TORCH_TESTS=.* holds no test_optim.py"):
        torch_tests_folder()


def test_without_the_tests_the_summary_says_they_were_skipped_and_why(tmp_path):
    # a plugin that points the default location at nothing, so the slow test skips
    (tmp_path / "no_default.py").write_text(
        "from pathlib import Path\n"
        "def pytest_collection_modifyitems(items):\n"
        "    for item in items:\n"
        "        item.module.DEFAULT_TESTS = Path('/nonexistent/torch-tests')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUNCOPT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_torch_suite.py", "-k", "pass_on_funcopt", "-p", "no_default",
         "-p", "no:cacheprovider", "-q"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0 and "1 skipped" in result.stdout, result.stdout + result.stderr
    summary = result.stdout[result.stdout.index("PyTorch's own optimizer tests were skipped") :]
    assert "FUNCOPT_TORCH_TESTS is not set and /nonexistent/torch-tests is absent" in summary, result.stdout
    assert "'Tests' in the README" in summary, result.stdout
