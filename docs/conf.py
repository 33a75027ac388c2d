"""Sphinx configuration. Build with ``sphinx-build -W -b html docs docs/_build/html``.

Pages are MyST Markdown; pages with ``{code-cell}`` blocks and the tutorial notebooks
are executed by myst-nb at build time, so a stale example fails the build.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import funcopt

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent

project = "funcopt"
author = "the funcopt developers"
copyright = "2026, the funcopt developers"
release = version = funcopt.__version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
exclude_patterns = ["_build", "jupyter_execute", "**.ipynb_checkpoints"]

html_theme = "furo"
html_title = f"funcopt {version}"

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# Execute every notebook and code-cell page; any error fails the build.
nb_execution_mode = "force"
# Each tutorial runs in under 30 s on 2 idle cores: the limit per cell leaves room for a
# machine 10x slower or busier than that.
nb_execution_timeout = 600
# The kernels that execute the pages inherit these variables. The tutorials run a smaller
# problem in the docs build than as scripts (examples/maml_sinusoid.py reads FUNCOPT_QUICK).
# One intra-op thread: the tutorials' tensors are small, and on a busy machine torch's
# threads, waiting on each other, made each tutorial 5-7x slower than on one thread.
os.environ["FUNCOPT_QUICK"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True
# tqdm writes progress bars to stderr; keep them out of the rendered pages
nb_output_stderr = "remove"

# The API reference lists every algorithm funcopt exports, found here rather than kept by
# hand: each class of funcopt's that subclasses fo.Optimizer, and its factory.
algorithms = sorted(
    name
    for name in funcopt.__all__
    if isinstance(getattr(funcopt, name), type)
    and issubclass(getattr(funcopt, name), funcopt.Optimizer)
    and getattr(funcopt, name) is not funcopt.Optimizer
)
entries = []
for name in algorithms:
    factory = next(f for f in funcopt.__all__ if f.replace("_", "") == name.lower())
    entries += [
        f".. autofunction:: funcopt.{factory}",
        "   :no-index:",
        f".. autoclass:: funcopt.{name}",
        "   :no-index:",
    ]
# Then the optimizers with no fo.Optimizer class (fo.amsgrad, fo.sam, the schedule-free
# classes, ...), as their pages under algorithms/ document them.
listed = {entry.split("funcopt.")[1] for entry in entries if "funcopt." in entry}
for page in sorted((DOCS / "algorithms").glob("*.md")):
    for kind, name in re.findall(
        r"^\.\. auto(function|class):: funcopt\.(\w+)$", page.read_text(), flags=re.M
    ):
        if name not in listed and not name.endswith("State"):
            entries += [f".. auto{kind}:: funcopt.{name}", "   :no-index:"]
            listed.add(name)
(DOCS / "_api_algorithms.md").write_text("```{eval-rst}\n" + "\n".join(entries) + "\n```\n")
exclude_patterns.append("_api_algorithms.md")

# The tutorial notebooks live in notebooks/ (generated from examples/): copy them in.
tutorials = DOCS / "tutorials"
tutorials.mkdir(exist_ok=True)
for notebook in (ROOT / "notebooks").glob("*.ipynb"):
    shutil.copy(notebook, tutorials / notebook.name)
