"""torch.distributed: DDP, ZeroRedundancyOptimizer, FSDP2 (DTensor params), the functional API on DTensors, and
torch.distributed.checkpoint. Each test starts 2 CPU processes with the gloo backend on
127.0.0.1 (a free port); collectives time out after 60 s, so a hang cannot outlast that.
The scenarios themselves are in distributed_workers.py."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers import ALGORITHMS

sys.path.insert(0, str(Path(__file__).parent))
import distributed_workers as workers  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo"),
]
WORLD = 2


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn, *args) -> None:
    torch.multiprocessing.spawn(fn, args=(WORLD, free_port(), ALGORITHMS, *args), nprocs=WORLD, join=True)


def test_ddp_matches_torch_and_single_process():
    spawn(workers.ddp)


def test_zero_redundancy_optimizer_matches_torch():
    spawn(workers.zero)


def test_fsdp2_matches_torch_with_sharded_state():
    spawn(workers.fsdp)


def test_functional_api_on_dtensors_without_communication():
    spawn(workers.functional_dtensor)


def test_distributed_checkpoint_round_trips(tmp_path):
    spawn(workers.dcp, str(tmp_path))


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
