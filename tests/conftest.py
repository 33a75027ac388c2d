"""Suite-wide pytest set-up: what is not collected, and what the run's summary must say."""

from __future__ import annotations

from typing import Any

# tests/torch_suite/ is the runner of PyTorch's own tests (run by test_torch_suite.py in a
# process of its own): importing its pytest plugin here would patch torch's test utilities
collect_ignore = ["torch_suite"]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say in the summary, not only with -rs, that PyTorch's own optimizer tests were
    skipped and why: a passing run without them checked less than the README claims."""
    skipped = [
        report
        for report in terminalreporter.stats.get("skipped", [])
        if report.nodeid.split("::")[0].endswith("test_torch_suite.py")
    ]
    if not skipped:
        return
    terminalreporter.section("PyTorch's own optimizer tests were skipped", yellow=True)
    for report in skipped:
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        terminalreporter.write_line(f"{report.nodeid}: {reason.removeprefix('Skipped: ')}")
