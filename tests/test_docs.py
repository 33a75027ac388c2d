"""The documentation builds with no warning, executing every code cell and notebook
(docs/conf.py: myst-nb, nb_execution_raise_on_error), so a stale example fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ALGORITHMS, factory

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    "getting-started", "concepts", "recipes", "long-inner-loops", "checkpoints", "distributed", "performance", "adding-an-algorithm", "api",
    "comparison", "coming-from-optax", "transforms", "schedules", "wrappers",
    "tutorials/drop_in_replacement", "tutorials/lr_sweep_vmap", "tutorials/maml_sinusoid",
    *(f"algorithms/{name.lower()}" for name in ALGORITHMS),
]  # fmt: skip


@pytest.mark.slow
def test_docs_build_without_warnings(tmp_path):
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_nb")
    out = tmp_path / "html"
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q", str(ROOT / "docs"), str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    warnings = [
        line for line in result.stderr.splitlines() if "WARNING" in line and "IPKernelApp" not in line
    ]
    assert result.returncode == 0 and not warnings, result.stderr[-5000:]
    for page in PAGES:
        assert (out / f"{page}.html").exists(), page
    for tutorial in ("drop_in_replacement", "lr_sweep_vmap", "maml_sinusoid"):  # executed, with plots
        assert "<img" in (out / "tutorials" / f"{tutorial}.html").read_text()
    # the API reference is generated from the docstrings
    assert 'id="funcopt.Optimizer"' in (out / "api.html").read_text()
    for name in ALGORITHMS:  # each algorithm's page documents its factory and its class
        page = (out / "algorithms" / f"{name.lower()}.html").read_text()
        assert f'id="funcopt.{factory(name).__name__}"' in page and f'id="funcopt.{name}"' in page
