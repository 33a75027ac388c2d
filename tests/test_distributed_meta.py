"""Meta-learning over 2 gloo processes on 127.0.0.1: each rank's MAML meta-gradient over
half the tasks, reduced across ranks (all_reduce_mean, DDP around a meta-loss module,
FSDP2 shards through unshard), equals one process's over all tasks (float64). The
workers are in distributed_meta_workers.py."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
import distributed_meta_workers as workers  # noqa: E402

import funcopt as fo

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
WORLD = 2


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    results = tmp_path_factory.mktemp("meta")
    try:
        torch.multiprocessing.spawn(workers.run, args=(WORLD, free_port(), str(results)), nprocs=WORLD)
    except Exception as e:  # the ranks' records say more
        print(f"spawn: {type(e).__name__}: {e}")
    return [json.loads(p.read_text()) for p in sorted(results.glob("*.json"))]


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["all_reduce_mean", "ddp", "fsdp2_unshard"])
def test_meta_gradients_over_ranks_equal_one_process(outcomes, scenario):
    assert len(outcomes) == WORLD
    for outcome in outcomes:
        assert "error" not in outcome, outcome["error"]
        assert outcome[scenario] <= 1e-12, outcome


def test_all_reduce_mean_needs_an_initialized_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    with pytest.raises(RuntimeError, match="init_process_group"):
        fo.distributed.all_reduce_mean([torch.ones(2)])


def test_unshard_passes_plain_tensors_through():
    tree = {"w": torch.ones(2), "n": 3}
    out = fo.distributed.unshard(tree)
    assert out["w"] is tree["w"] and out["n"] == 3
