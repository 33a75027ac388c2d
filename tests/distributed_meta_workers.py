"""Workers for tests/test_distributed_meta.py, each run on 2 CPU processes (gloo,
127.0.0.1): MAML meta-gradients over each rank's share of the tasks, reduced across
the ranks (fo.distributed.all_reduce_mean, DDP around a meta-loss module, FSDP2 shards
through fo.distributed.unshard), against one process's meta-gradient over all tasks.
Each writes ``results/<rank>.json``: the largest relative error per scenario, or the
traceback."""

from __future__ import annotations

import copy
import datetime
import json
import os
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.func import functional_call

import funcopt as fo

D = torch.float64
TASKS = 8


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(D)


def tasks() -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(TASKS):
        amp, phase = torch.rand(2, dtype=D, generator=g) * torch.tensor([4.0, 3.0], dtype=D)
        xs = torch.rand(2, 10, 1, dtype=D, generator=g) * 10 - 5
        ys = amp * torch.sin(xs + phase)
        out.append((xs[0], ys[0], xs[1], ys[1]))
    return out


class MetaLoss(torch.nn.Module):
    """MAML's meta-loss over tasks, as a module (its forward adapts the model's params
    with fo.inner_loop): DDP wraps it as any model."""

    def __init__(self, model: torch.nn.Module, steps: int = 3):
        super().__init__()
        self.model, self.steps = model, steps

    def loss(self, params, x, y):
        return torch.nn.functional.mse_loss(functional_call(self.model, params, (x,)), y)

    def forward(self, tasks, params=None):
        params = dict(self.model.named_parameters()) if params is None else params
        total = 0.0
        for xs, ys, xq, yq in tasks:
            adapted, _, _ = fo.inner_loop(self.loss, params, fo.adam(lr=0.05), [(xs, ys)] * self.steps)
            total = total + self.loss(adapted, xq, yq)
        return total / len(tasks)


def reference() -> list[torch.Tensor]:
    meta = MetaLoss(make_model())
    return list(torch.autograd.grad(meta(tasks()), list(meta.model.parameters())))


def rel(got, want) -> float:
    return max(float((g - w).norm() / w.norm()) for g, w in zip(got, want))


def scenarios(rank: int, world: int) -> dict[str, float]:
    want = reference()
    mine = tasks()[rank::world]
    errors = {}

    meta = MetaLoss(make_model())
    grads = torch.autograd.grad(meta(mine), list(meta.model.parameters()))
    errors["all_reduce_mean"] = rel(fo.distributed.all_reduce_mean(grads), want)

    ddp = torch.nn.parallel.DistributedDataParallel(MetaLoss(make_model()))
    ddp(mine).backward()
    errors["ddp"] = rel([p.grad for p in ddp.module.model.parameters()], want)

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    skeleton = make_model()  # the architecture functional_call runs; the params are the shards'
    sharded = fully_shard(copy.deepcopy(skeleton), mesh=init_device_mesh("cpu", (world,)))
    params = fo.distributed.unshard(dict(sharded.named_parameters()))
    MetaLoss(skeleton)(mine, params).backward()
    errors["fsdp2_unshard"] = rel([p.grad.full_tensor() for p in sharded.parameters()], want)
    return errors


def run(rank: int, world: int, port: int, results: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    try:
        outcome: dict[str, object] = scenarios(rank, world)
    except Exception:
        outcome = {"error": traceback.format_exc()}
        raise
    finally:
        Path(results, f"{rank}.json").write_text(json.dumps(outcome))
    dist.barrier()
    dist.destroy_process_group()
