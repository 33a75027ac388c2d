"""torch.distributed: DDP, ZeroRedundancyOptimizer, FSDP2 (DTensor params), the functional API on DTensors, and
torch.distributed.checkpoint, for each class funcopt exports, against torch.optim's.
Each scenario starts 2 CPU processes with the gloo backend on 127.0.0.1 (a free port)
once, for all classes, and each class's test reads its outcome there; collectives time
out after 60 s, so a hang cannot outlast that. A class whose torch.optim twin fails in a
scenario too (tried there) skips it with torch's error. The scenarios themselves are in
distributed_workers.py."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers import ALGORITHMS, steps_on_dense_gradients

sys.path.insert(0, str(Path(__file__).parent))
import distributed_workers as workers  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo"),
]
WORLD = 2

# The classes whose step takes the dense gradients of a backward pass alone, by torch's
# OptimizerInfo: not LBFGS (its step needs a closure), not SparseAdam (sparse gradients
# only); tests/test_lbfgs.py and tests/test_sparse_adam.py cover those. A class that
# steps matrices only (Muon) trains the models without biases.
CLASSES = [name for name in ALGORITHMS if steps_on_dense_gradients(name)]

_runs: dict[str, tuple[dict[str, tuple[str, str]], str]] = {}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(scenario: str, key: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Pass, skip or fail as `key` (a class's name) did in the worker `scenario`, which
    runs once, for all of CLASSES, on WORLD processes. A key with no outcome (after a
    failure, a worker runs nothing more) fails with the worker's error."""
    if scenario not in _runs:
        results = tmp_path_factory.mktemp(scenario)
        error = "no outcome recorded"
        try:
            torch.multiprocessing.spawn(
                getattr(workers, scenario), args=(WORLD, free_port(), CLASSES, str(results)), nprocs=WORLD
            )
        except Exception as e:
            error = f"not run, after a failure in the worker: {type(e).__name__}: {e}"
        outcomes: dict[str, tuple[str, str]] = {}
        worse = {"passed": 0, "skipped": 1, "failed": 2}
        for path in sorted(results.glob("*.json")):  # per key, the worse outcome of the ranks'
            for k, (status, detail, _seconds) in json.loads(path.read_text()).items():
                if k not in outcomes or worse[status] > worse[outcomes[k][0]]:
                    outcomes[k] = (status, detail)
        _runs[scenario] = outcomes, error
    outcomes, error = _runs[scenario]
    status, detail = outcomes.get(key, ("failed", error))
    if status == "skipped":
        pytest.skip(f"{scenario}: {detail}")
    assert status == "passed", detail


@pytest.mark.parametrize("name", CLASSES)
def test_ddp_matches_torch_and_single_process(name, tmp_path_factory):
    check("ddp", name, tmp_path_factory)


@pytest.mark.parametrize("name", CLASSES)
def test_zero_redundancy_optimizer_matches_torch(name, tmp_path_factory):
    check("zero", name, tmp_path_factory)


@pytest.mark.parametrize("name", CLASSES)
def test_fsdp2_matches_torch_with_sharded_state(name, tmp_path_factory):
    check("fsdp", name, tmp_path_factory)


def test_fsdp2_chain_clips_by_the_global_norm_across_shards(tmp_path_factory):
    check("fsdp", "chain", tmp_path_factory)


@pytest.mark.parametrize("name", CLASSES)
def test_functional_api_on_dtensors(name, tmp_path_factory):
    check("functional_dtensor", name, tmp_path_factory)


@pytest.mark.parametrize("name", CLASSES)
def test_distributed_checkpoint_round_trips(name, tmp_path_factory):
    check("dcp", name, tmp_path_factory)


def test_distributed_example_runs(tmp_path):
    """examples/distributed_training.py, which docs/distributed.md shows, runs."""
    import os
    import subprocess

    script = Path(__file__).resolve().parents[1] / "examples" / "distributed_training.py"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}  # loopback
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for line in (
        "DDP + funcopt.NAdam",
        "FSDP2 + funcopt.NAdam",
        "reloaded into torch.optim.NAdam",
        "on a DTensor",
    ):
        assert line in result.stdout
