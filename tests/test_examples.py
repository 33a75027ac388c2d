"""The notebooks are in sync with their source scripts in examples/, and the demo
writes its figure. The notebooks are generated from the scripts with
``jupytext --to notebook --set-kernel python3 examples/NAME.py -o notebooks/NAME.ipynb``
and executed by the documentation build (tests/test_docs.py); their last cell asserts
the result."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_four_tutorials():
    assert {p.stem for p in NOTEBOOKS} == {"drop_in_replacement", "imaml", "lr_sweep_vmap", "maml_sinusoid"}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_matches_its_script(notebook):
    jupytext = pytest.importorskip("jupytext")
    nbformat = pytest.importorskip("nbformat")
    script = jupytext.read(ROOT / "examples" / f"{notebook.stem}.py")
    saved = nbformat.read(notebook, as_version=4)
    cells = lambda nb: [(c.cell_type, c.source.strip()) for c in nb.cells]  # noqa: E731
    assert cells(saved) == cells(script), f"regenerate {notebook.name} from examples/{notebook.stem}.py"


@pytest.mark.slow
def test_demo_writes_its_figure(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "demo.png"
    demo = subprocess.Popen(
        [sys.executable, "-m", "funcopt.demo", "--quick", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    first_line = demo.stdout.readline()
    running = demo.poll() is None  # a line printed without flush would come only at the end
    stdout, stderr = demo.communicate(timeout=600)
    result = subprocess.CompletedProcess(demo.args, demo.returncode, first_line + stdout, stderr)
    assert result.returncode == 0, result.stderr
    assert running and first_line.startswith("1. drop-in replacement"), first_line
    # a line as each stage starts, and progress lines through the stages (no bars here)
    stages = [line[:2] for line in result.stdout.splitlines() if re.match(r"\d\. ", line)]
    assert stages == ["1.", "2.", "3."], result.stdout
    assert re.search(r"^   MAML: 60/300 \(\d+ s\)$", result.stdout, flags=re.M), result.stdout
    assert out.stat().st_size > 10_000
    assert "largest parameter difference" in result.stdout and "MAML" in result.stdout
    # the sweep's agreement is reported per run: the stable runs compared, the others named
    agree = re.search(
        r"agree on the (\d+) runs whose loss never rose above its start: final losses within (\S+)",
        result.stdout,
    )
    assert agree, result.stdout
    assert int(agree[1]) >= 8 and float(agree[2]) < 1e-4, result.stdout
    unstable = re.search(r"lr ([\d., e-]+): unstable .* not compared", result.stdout)
    assert unstable is None or int(agree[1]) + len(unstable[1].split(",")) == 16, result.stdout
    # stderr is a pipe here, not a terminal: no progress bars in it (tqdm's disable=None)
    assert "it/s" not in result.stderr and "%|" not in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize("script", sorted((ROOT / "examples").glob("*.py")), ids=lambda p: p.stem)
def test_progress_bars_only_on_a_terminal(script):
    """Every tqdm bar in the examples passes disable=None: a bar on a terminal or in
    Jupyter, none in a log file (a bar writes a line per update there)."""
    source = script.read_text()
    calls = re.findall(r"\btqdm\((.*)\)", source)
    assert all("disable=None" in call for call in calls), f"{script.name}: a tqdm(...) without disable=None"
