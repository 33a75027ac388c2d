"""The documentation builds with no warning, executing every code cell and notebook
(docs/conf.py: myst-nb, nb_execution_raise_on_error), so a stale example fails here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ALGORITHMS, factory

import funcopt as fo

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    "getting-started", "concepts", "recipes", "long-inner-loops", "checkpoints", "distributed", "performance", "adding-an-algorithm", "api",
    "comparison", "coming-from-optax", "transforms", "schedules", "wrappers",
    "tutorials/drop_in_replacement", "tutorials/lr_sweep_vmap", "tutorials/maml_sinusoid", "tutorials/imaml",
    *(f"algorithms/{name.lower()}" for name in ALGORITHMS),
    *(f"algorithms/{page.stem}" for page in sorted((ROOT / "docs" / "algorithms").glob("*.md"))),
]  # fmt: skip
# optax's optimizers beyond torch.optim (aliases and contrib), and schedule-free's
OPTAX_OPTIMIZERS = [
    "adabelief", "adamaxw", "adan", "amsgrad", "fromage", "lamb", "lars", "lion", "nadamw", "novograd",
    "optimistic_gradient_descent", "optimistic_adam", "polyak_sgd", "sign_sgd", "signum", "sm3", "yogi",
    "adopt", "ademamix", "simplified_ademamix", "cocob", "dadapt_adamw", "dog", "dowg", "madgrad", "momo",
    "momo_adam", "prodigy", "reduce_on_plateau", "sam", "sophia", "schedule_free_sgd", "schedule_free_adamw",
]  # fmt: skip
# every torch.optim.Optimizer class funcopt exports (torch's, the catalogue's, schedule-free's)
CLASSES = sorted(
    name
    for name in fo.__all__
    if isinstance(getattr(fo, name), type) and issubclass(getattr(fo, name), torch.optim.Optimizer)
    and getattr(fo, name) is not fo.Optimizer
)  # fmt: skip


def documented_on_algorithm_pages() -> dict[str, str]:
    """The names each docs/algorithms page documents (``.. autofunction::`` or
    ``.. autoclass::``), to the page's name."""
    found = {}
    for page in sorted((ROOT / "docs" / "algorithms").glob("*.md")):
        for name in re.findall(
            r"^\.\. auto(?:function|class):: funcopt\.(\w+)$", page.read_text(), flags=re.M
        ):
            found.setdefault(name, page.stem)
    return found


def test_every_optimizer_has_an_algorithm_page():
    """Each optax optimizer and each drop-in class is documented on a page under
    docs/algorithms (related methods may share one), from which docs/conf.py lists it in
    the API reference."""
    found = documented_on_algorithm_pages()
    missing = [name for name in [*OPTAX_OPTIMIZERS, *CLASSES] if name not in found]
    assert not missing, f"no docs/algorithms page documents {missing}"
    assert all(hasattr(fo, name) for name in OPTAX_OPTIMIZERS)


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
    for tutorial in (
        "drop_in_replacement",
        "lr_sweep_vmap",
        "maml_sinusoid",
        "imaml",
    ):  # executed, with plots
        assert "<img" in (out / "tutorials" / f"{tutorial}.html").read_text()
    # the API reference is generated from the docstrings
    assert 'id="funcopt.Optimizer"' in (out / "api.html").read_text()
    for name in ALGORITHMS:  # each algorithm's page documents its factory and its class
        page = (out / "algorithms" / f"{name.lower()}.html").read_text()
        assert f'id="funcopt.{factory(name).__name__}"' in page and f'id="funcopt.{name}"' in page
    api = (out / "api.html").read_text()  # and the API reference lists every optimizer
    for name in [*OPTAX_OPTIMIZERS, *CLASSES]:
        assert f'<span class="pre">{name}</span>' in api, name
