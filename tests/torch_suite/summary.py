"""run.sh's summary of its runs: each run's counts (and per class), the tests whose outcome
differs between torch and funcopt, and last funcopt's "N passed, M failed".

    python summary.py RESULTS_FOLDER torch funcopt

RESULTS_FOLDER holds each run's JSON results (_peer_plugin.py writes them), IMPL.json.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def load(folder: Path, impl: str) -> dict | None:
    """A run's results, or None where it crashed or timed out before writing them."""
    try:
        return json.loads((folder / f"{impl}.json").read_text())
    except (OSError, ValueError):
        return None


def per_class(meta: dict) -> str:
    """passed/failed-or-error/skipped of each selected class."""
    by: dict[str, Counter] = {}
    for test, outcome in meta["outcomes"].items():
        by.setdefault(meta["classes"].get(test), Counter())[outcome] += 1
    parts = []
    for name in meta["algos"]:
        c = by.get(name, Counter())
        parts.append(f"{name} {c['passed']}p/{c['failed'] + c['error']}f/{c['skipped']}s")
    return "; ".join(parts)


def main(folder: Path, runs: list[str]) -> None:
    meta = {impl: load(folder, impl) for impl in runs}
    res = {impl: (m["outcomes"] if m else None) for impl, m in meta.items()}
    for impl in runs:
        o, m = res[impl], meta[impl]
        if o is None:
            print(f"{impl}: no results (crash or timeout)")
            continue
        counts = ", ".join(f"{v} {k}" for k, v in sorted(Counter(o.values()).items()))
        print(f"{impl}: {counts} of {len(o)} selected")
        if m and len(m.get("algos", [])) > 1:
            print(f"  per class (passed/failed or error/skipped): {per_class(m)}")
            if m.get("missing"):
                print(f"  funcopt lacks {', '.join(m['missing'])}: their tests count as failed")
    torch_run, funcopt_run = res.get("torch"), res.get("funcopt")
    if torch_run and funcopt_run:
        diff = sorted(k for k in set(torch_run) | set(funcopt_run) if torch_run.get(k) != funcopt_run.get(k))
        print(f"tests whose outcome differs between torch and funcopt: {len(diff)}")
        for k in diff:
            print(f"  {k.split('::')[-1]}: torch {torch_run.get(k)}, funcopt {funcopt_run.get(k)}")
    last = res.get("funcopt") if "funcopt" in runs else res.get(runs[-1])
    if last is None:
        print("0 passed, 1 failed")
    else:
        c = Counter(last.values())
        print(f"{c['passed']} passed, {c['failed'] + c['error']} failed")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
