"""The code a reader copies runs: every ```python block of README.md, and of the
documentation pages (docs/**/*.md). The docs build executes a page's ``{code-cell}``
cells, but nothing else runs its plain code blocks.

- README.md: each block is a whole program (imports, data, model) and runs in a fresh
  namespace.
- A docs page with python blocks: its code cells and blocks run in page order in one
  namespace, as a reader would run the page top to bottom (a block may use what a cell
  above it defined).
- A block that starts with ``>>>`` runs as a doctest: its printed output is checked.
- A block that is not meant to run (a fragment, pseudo-code, needs a GPU) has
  ``<!-- norun -->`` on the line before its fence.

Each file runs in a new Python process (in a temporary directory, matplotlib drawing
off screen), so no block changes torch's global state for the other tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NORUN = "<!-- norun -->"
# ```python, ```py, ```{code-block} python, ```{code} python (also with ~~~ or longer
# fences), and myst-nb's executed ```{code-cell} python
OPENING = re.compile(
    r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?:\{(?P<directive>code-block|code|code-cell)\}\s*)?"
    r"(?:python3?|py|ipython3?)\s*$"
)


def python_blocks(path: Path) -> list[dict]:
    """The python code blocks of a Markdown file, in order: source, line of its first
    line, whether it is an executed ``{code-cell}`` (else a plain block), and whether
    it is not to be run (``<!-- norun -->``, or a cell tagged ``skip-execution``)."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = OPENING.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        closing = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        previous = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
        start = end = i + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        if end == len(lines):
            raise AssertionError(f"{path.name}:{i + 1}: a code block that is never closed")
        body, options = lines[start:end], ""
        if body and body[0].strip() == "---":  # a directive's options as YAML between --- lines
            close = next((k for k in range(1, len(body)) if body[k].strip() == "---"), 0)
            options, body, start = "\n".join(body[1:close]), body[close + 1 :], start + close + 1
        while body and re.match(r"^\s*:[\w-]+:", body[0]):  # a directive's options (:tags: ...)
            options, body, start = options + body[0], body[1:], start + 1
        source = textwrap.dedent("\n".join(line.removeprefix(indent) for line in body))
        cell = opening["directive"] == "code-cell"
        if cell:  # IPython-only lines (magics, shell escapes) do not run in plain Python
            source = "\n".join("" if line.lstrip()[:1] in ("%", "!") else line for line in source.split("\n"))
        blocks.append({
            "source": source, "line": start + 1, "cell": cell,
            "norun": previous == NORUN or (cell and "skip-execution" in options),
            "raises": cell and "raises-exception" in options,
        })  # fmt: skip
        i = end + 1
    return blocks


# Run in the child process: each block compiled under its file's name and line numbers, so
# a traceback points into the Markdown file.
RUNNER = r"""
import doctest, json, sys, traceback
job = json.load(sys.stdin)
shared = {"__name__": "__main__"}
for block in job["blocks"]:
    namespace = {"__name__": "__main__"} if job["fresh"] else shared
    where = f"{job['file']}, the {'cell' if block['cell'] else 'block'} at line {block['line']}"
    source = "\n" * (block["line"] - 1) + block["source"]
    try:
        if block["source"].lstrip().startswith(">>>"):
            test = doctest.DocTestParser().get_doctest(source, namespace, where, job["file"], 0)
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
            runner.run(test, out=sys.stderr.write, clear_globs=False)
            if runner.failures:
                raise AssertionError(f"{runner.failures} doctest example(s) failed")
        else:
            exec(compile(source, job["file"], "exec"), namespace)
    except Exception:
        if not block["raises"]:  # a cell tagged raises-exception shows its error on the page
            traceback.print_exc()
            sys.exit(f"FAILED: {where}")
    print(f"ran {where}", flush=True)
"""


def run_blocks(path: Path, fresh: bool, tmp_path: Path) -> None:
    """Run the file's python blocks in a new process: each in a fresh namespace, or (with
    ``fresh=False``) with its code cells, in page order, in one namespace."""
    blocks = [b for b in python_blocks(path) if not b["norun"] and not (fresh and b["cell"])]
    job = {"file": str(path), "fresh": fresh, "blocks": blocks}
    env = {**os.environ, "MPLBACKEND": "Agg"}
    result = subprocess.run(
        [sys.executable, "-c", RUNNER], input=json.dumps(job), capture_output=True, text=True,
        cwd=tmp_path, env=env, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    assert result.stdout.count("ran ") == len(blocks), result.stdout


def test_readme_blocks_are_whole_programs(tmp_path):
    blocks = python_blocks(ROOT / "README.md")
    assert len(blocks) >= 4, "README.md shows its code in ```python blocks"
    assert not any(b["norun"] or b["cell"] for b in blocks), "every README block is a whole program"
    run_blocks(ROOT / "README.md", fresh=True, tmp_path=tmp_path)


# every page, new ones included, that has a plain python block to run
DOCS = [
    page
    for page in sorted((ROOT / "docs").rglob("*.md"))
    if not {"_build", "jupyter_execute"} & set(page.relative_to(ROOT / "docs").parts)
    and any(not b["norun"] and not b["cell"] for b in python_blocks(page))
]


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT / "docs")))
def test_docs_python_blocks_run(page, tmp_path):
    run_blocks(page, fresh=False, tmp_path=tmp_path)


def test_blocks_are_found(tmp_path):
    """The parser finds fenced, directive and indented blocks, cells and the marker, and
    the runner runs what is not marked."""
    page = tmp_path / "page.md"
    page.write_text(
        textwrap.dedent(
            """\
            ```python
            a = 1
            ```
            <!-- norun -->

            ```py
            b = undefined
            ```
            - item:

              ````{code-block} python
              :caption: c

              c = a + 2
              ````
            ```{code-cell} python
            ---
            tags: [raises-exception]
            ---
            %matplotlib inline
            1 / 0
            ```
            ```bash
            echo no
            ```
            ```python
            >>> print(c)
            3
            ```
            """
        )
    )
    blocks = python_blocks(page)
    summary = [(b["source"].strip(), b["line"], b["cell"], b["norun"]) for b in blocks]
    assert summary == [
        ("a = 1", 2, False, False),
        ("b = undefined", 7, False, True),
        ("c = a + 2", 13, False, False),
        ("1 / 0", 20, True, False),
        (">>> print(c)\n3", 27, False, False),
    ]
    run_blocks(page, fresh=False, tmp_path=tmp_path)  # the norun block is left out
    with pytest.raises(AssertionError, match="NameError"):  # fresh: c = a + 2 has no a
        run_blocks(page, fresh=True, tmp_path=tmp_path)


def test_benchmark_tables_are_generated_and_included():
    """docs/performance.md shows the benchmarks' tables as written by the scripts
    (``--write-table``): each included file exists, and each names the command that
    wrote it."""
    included = {
        (page.parent / target).resolve()
        for page in (ROOT / "docs").rglob("*.md")
        for target in re.findall(r"^```\{include\}\s+(\S+)", page.read_text(), flags=re.M)
    }
    assert all(path.exists() for path in included), sorted(map(str, included))
    generated = sorted((ROOT / "docs" / "_generated").glob("*.md"))
    assert generated and set(generated) <= included, "every generated table is shown on a page"
    for table in generated:
        command = re.search(
            r"^_`python (benchmarks/\w+\.py) [^`]*--write-table docs/_generated/(\S+)`",
            table.read_text(),
            re.M,
        )
        assert command and (ROOT / command[1]).exists() and command[2] == table.name, table.name
