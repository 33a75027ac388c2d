"""pytest plugin (loaded with ``-p _peer_plugin`` by run.sh) that runs PyTorch's own optimizer
tests (its ``test/test_optim.py``: TestOptimRenewed, and TestDifferentiableOptimizer from
``test/optim/test_optim.py``) against either torch.optim itself or funcopt's classes.

PEER_IMPL=torch    reference run: nothing is substituted.
PEER_IMPL=funcopt  the selected torch.optim classes are replaced by funcopt's classes *before*
                   the test modules (and torch's OptimizerInfo database,
                   torch.testing._internal.common_optimizers) are imported, so every
                   ``from torch.optim import NAdam`` in them, and every OptimizerInfo's
                   ``optim_cls``, is funcopt's class. The plugin checks this after import.

PEER_ALGOS picks the classes: unset or empty = the four seed classes (Adadelta, Adagrad,
Adamax, NAdam; the default, unchanged); ``all`` = every torch.optim class the contract names
(the four + SGD, Adam, AdamW, RMSprop, Rprop, RAdam, ASGD, Adafactor, Muon, SparseAdam, LBFGS);
or a comma-separated list of class names (case-insensitive).

A selected class that funcopt lacks is replaced by a stand-in whose constructor raises
NotImplementedError, and every selected test of that class that would otherwise pass is
reported failed ("funcopt has no X"): the funcopt count then measures coverage. Tests that
skip (GPU-only) still skip, as they do in the reference run.

Both runs select the same tests: the TestOptimRenewedCPU tests instantiated for the selected
classes (test ids containing ``_<Class>_cpu``), TestDifferentiableOptimizer's tests of the
selected classes (test_adadelta ... test_radam; with Adam/AdamW/SGD also their
``*_differentiable_*`` hyperparameter tests), and with AdamW ``test_adamw_serialization``,
with LBFGS ``test_step_iteration``. Everything else in the files is deselected.

Compatibility shims (applied in both runs, so they cannot explain a difference between them):
- ``optim.test_lrscheduler`` and ``optim.test_swa_utils`` (imported by test_optim.py for their
  own, SGD-based test classes) are replaced by empty stand-ins: not vendored, not relevant.
- ``torch.testing._internal.common_utils.HardwareClassification`` (used by the newer
  ``optim/test_optim.py`` as a class attribute only) is added when torch 2.13 lacks it.
- test_optim.py's module-level ``SGD`` (a helper second optimizer in test_step_all_hooks of
  every class) stays torch's when SGD is not substituted or funcopt lacks it, so a missing
  SGD fails SGD's tests only.

Per-test outcomes (and each test's class) are written as JSON to $PEER_RESULTS (if set).
"""

from __future__ import annotations

import enum
import json
import os
import re
import sys
import types
import unittest

import pytest
import torch

IMPL = os.environ.get("PEER_IMPL", "torch")
SEED_ALGOS = ("Adadelta", "Adagrad", "Adamax", "NAdam")
ALL_ALGOS = SEED_ALGOS + (
    "SGD",
    "Adam",
    "AdamW",
    "RMSprop",
    "Rprop",
    "RAdam",
    "ASGD",
    "Adafactor",
    "Muon",
    "SparseAdam",
    "LBFGS",
)


def _select(spec: str | None) -> tuple[str, ...]:
    spec = (spec or "").strip()
    if not spec:
        return SEED_ALGOS
    if spec.lower() == "all":
        return ALL_ALGOS
    by_lower = {n.lower(): n for n in ALL_ALGOS}
    picked = set()
    for tok in filter(None, (t.strip() for t in spec.split(","))):
        if tok.lower() not in by_lower:
            raise SystemExit(
                f"PEER_ALGOS: unknown class {tok!r}; choose from {', '.join(ALL_ALGOS)} or 'all'"
            )
        picked.add(by_lower[tok.lower()])
    if not picked:
        raise SystemExit(f"PEER_ALGOS={spec!r} selects nothing")
    return tuple(n for n in ALL_ALGOS if n in picked)


ALGOS = _select(os.environ.get("PEER_ALGOS"))
ORIGINAL = {name: getattr(torch.optim, name) for name in ALL_ALGOS}
_RENEWED = re.compile(r"TestOptimRenewed\w*::test_\w*_({})_cpu".format("|".join(ALL_ALGOS)))
# TestDifferentiableOptimizer's tests, by the class each one tests (optim/test_optim.py)
_DIFF = re.compile(r"TestDifferentiableOptimizer::test_(\w+)$")
_DIFF_CLASS = {
    "sgd": "SGD",
    "adam": "Adam",
    "rmsprop": "RMSprop",
    "adadelta": "Adadelta",
    "adagrad": "Adagrad",
    "adamax": "Adamax",
    "asgd": "ASGD",
    "rprop": "Rprop",
    "adamw": "AdamW",
    "nadam": "NAdam",
    "radam": "RAdam",
}
# single tests named after no class: test_adamw_serialization (AdamW, loads into Adam too) and
# test_step_iteration (LBFGS); deselected unless their class is selected
_SINGLE = {"test_adamw_serialization": "AdamW", "test_step_iteration": "LBFGS"}


def class_of(nodeid: str) -> str | None:
    """The torch.optim class a selectable test belongs to, or None (not selectable)."""
    m = _RENEWED.search(nodeid)
    if m:
        return m.group(1)
    tail = nodeid.split("::")[-1]
    m = _DIFF.search(nodeid.split("::", 1)[-1])
    if m:
        name = m.group(1)
        if name in _DIFF_CLASS:
            return _DIFF_CLASS[name]
        for prefix, cls in (
            ("adamw_differentiable_", "AdamW"),
            ("adam_differentiable_", "Adam"),
            ("differentiable_", "SGD"),
        ):
            if name.startswith(prefix):
                return cls
        return None
    if "TestOptimRenewed" in nodeid:
        for name, cls in _SINGLE.items():
            if tail == name or tail.startswith(name + "_"):
                return cls
    return None


def _install_shims() -> None:
    from torch.testing._internal import common_utils

    if not hasattr(common_utils, "HardwareClassification"):

        class HardwareClassification(enum.Enum):  # stand-in: only .GENERIC is read
            GENERIC = "generic"

        common_utils.HardwareClassification = HardwareClassification
    for name, cls_name in (
        ("optim.test_lrscheduler", "TestLRScheduler"),
        ("optim.test_swa_utils", "TestSWAUtils"),
    ):
        mod = types.ModuleType(name)
        setattr(mod, cls_name, type(cls_name, (common_utils.TestCase,), {}))
        sys.modules[name] = mod


def _stand_in(name: str) -> type:
    """What a class funcopt lacks is replaced by: same name, fails on construction."""

    def __init__(self, params, *args, **kwargs):  # noqa: ARG001
        raise NotImplementedError(f"funcopt has no {name} (PEER_ALGOS selects it)")

    return type(
        name,
        (torch.optim.Optimizer,),
        {"__init__": __init__, "__module__": "funcopt.MISSING", "_peer_missing": True},
    )


MISSING: set[str] = set()


def _substitute() -> dict[str, type]:
    import funcopt as fo

    classes = {}
    for name in ALGOS:
        cls = getattr(fo, name, None)
        if cls is None:
            MISSING.add(name)
            cls = _stand_in(name)
        elif not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            raise SystemExit(f"funcopt.{name} is not a torch.optim.Optimizer subclass")
        classes[name] = cls
    for name, cls in classes.items():
        setattr(torch.optim, name, cls)
    if "torch.testing._internal.common_optimizers" in sys.modules:
        raise SystemExit(
            "common_optimizers was imported before the substitution; the run would not be faithful"
        )
    return classes


_install_shims()
SUBSTITUTED = _substitute() if IMPL == "funcopt" else {}
if IMPL not in ("torch", "funcopt"):
    raise SystemExit(f"PEER_IMPL must be 'torch' or 'funcopt', not {IMPL!r}")

_outcomes: dict[str, str] = {}


def pytest_collection_modifyitems(session, config, items):  # noqa: ARG001
    keep, drop = [], []
    for item in items:
        (keep if class_of(item.nodeid) in ALGOS else drop).append(item)
    items[:] = keep
    config.hook.pytest_deselected(items=drop)
    # the helper SGD of test_step_all_hooks: funcopt's only when SGD is substituted and exists
    helper_sgd = SUBSTITUTED["SGD"] if "SGD" in SUBSTITUTED and "SGD" not in MISSING else ORIGINAL["SGD"]
    for mod in {getattr(item, "module", None) for item in items}:
        if mod is not None and hasattr(mod, "SGD") and hasattr(mod, "TestOptimRenewedCPU"):
            mod.SGD = helper_sgd
    # the substitution must have reached what the tests use
    from torch.testing._internal.common_optimizers import optim_db

    for info in optim_db:
        if info.name in ALGOS:
            want = SUBSTITUTED.get(info.name)
            got = info.optim_cls
            if want is not None and got is not want:
                raise SystemExit(f"OptimizerInfo {info.name} still uses {got.__module__}.{got.__name__}")
            if want is None and not got.__module__.startswith("torch.optim"):
                raise SystemExit(f"reference run but OptimizerInfo {info.name} uses {got.__module__}")
    mod = sys.modules.get("optim.test_optim")
    if mod is not None:
        for name in ALGOS:
            if not hasattr(mod, name):  # Adafactor, Muon, SparseAdam, LBFGS: no such tests there
                continue
            want = SUBSTITUTED.get(name, getattr(sys.modules["torch.optim"], name))
            if getattr(mod, name) is not want:
                raise SystemExit(f"optim/test_optim.py's {name} is not the class under test")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # noqa: ARG001
    """A test of a class funcopt lacks that passed anyway (it never built the optimizer) counts
    as failed: every selected test of a missing class fails unless it skips."""
    outcome = yield
    rep = outcome.get_result()
    cls = class_of(item.nodeid)
    if cls in MISSING and rep.when == "call" and rep.passed:
        rep.outcome = "failed"
        rep.longrepr = f"funcopt has no {cls}: counted as failed"


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = report.outcome
        if outcome == "failed" and report.when == "setup":
            outcome = "error"
        _outcomes[report.nodeid] = outcome
    elif report.when == "teardown" and report.outcome == "failed":
        _outcomes[report.nodeid] = "error"


def pytest_sessionfinish(session, exitstatus):  # noqa: ARG001
    path = os.environ.get("PEER_RESULTS")
    if path:
        with open(path, "w") as f:
            json.dump(
                {
                    "impl": IMPL,
                    "torch": torch.__version__,
                    "algos": list(ALGOS),
                    "missing": sorted(MISSING),
                    "outcomes": _outcomes,
                    "classes": {k: class_of(k) for k in _outcomes},
                },
                f,
                indent=0,
            )


def pytest_report_header(config):  # noqa: ARG001
    where = {n: f"{c.__module__}.{c.__qualname__}" for n, c in SUBSTITUTED.items()} or "none (torch.optim)"
    return [
        f"peer run: PEER_IMPL={IMPL}; classes: {', '.join(ALGOS)}; substituted: {where}"
        + (
            f"; funcopt lacks (stand-ins, their tests count as failed): {', '.join(sorted(MISSING))}"
            if MISSING
            else ""
        )
    ]


del unittest  # imported for readers: the upstream tests are unittest.TestCase subclasses
