"""funcopt with torch.distributed: DDP, FSDP2 and distributed checkpoints.

Nothing funcopt-specific is needed: the torch.optim classes keep torch's state layout,
so DistributedDataParallel, FSDP2 (``fully_shard``, DTensor params) and
``torch.distributed.checkpoint`` work as with torch.optim. The functional API works on
DTensors too: the state comes out sharded like the params, and a step communicates
nothing.

Runs on 2 CPU processes (gloo backend, 127.0.0.1):

    python examples/distributed_training.py

With GPUs, use the "nccl" backend and ``init_device_mesh("cuda", ...)``, and launch
with ``torchrun --nproc-per-node N`` instead of ``mp.spawn``.
"""

from __future__ import annotations

import os
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard, distribute_tensor
from torch.nn.parallel import DistributedDataParallel as DDP

import funcopt as fo


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))


def train(model, optimizer, steps, rank):
    g = torch.Generator().manual_seed(rank)  # each rank its own data
    for _ in range(steps):
        x = torch.randn(16, 8, generator=g)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), x[:, :2])
        loss.backward()
        optimizer.step()
    return loss.item()


def main(rank: int, world: int, port: int, checkpoint_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))

    # 1. DistributedDataParallel: gradients are all-reduced; the optimizer is unchanged.
    model = DDP(make_model())
    loss = train(model, fo.NAdam(model.parameters(), lr=1e-2), 20, rank)
    if rank == 0:
        print(f"DDP + funcopt.NAdam: loss {loss:.4f}")

    # 2. FSDP2: params, gradients and optimizer state are DTensors, sharded across ranks.
    model = make_model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = fo.NAdam(model.parameters(), lr=1e-2)
    loss = train(model, optimizer, 20, rank)
    weight = model[0].weight
    if rank == 0:
        print(f"FSDP2 + funcopt.NAdam: loss {loss:.4f}; exp_avg is {type(optimizer.state[weight]['exp_avg']).__name__} "
              f"{optimizer.state[weight]['exp_avg'].placements}, local shard {tuple(optimizer.state[weight]['exp_avg'].to_local().shape)}")  # fmt: skip

    # 3. Distributed checkpoint: save sharded; load into a fresh model and optimizer (a
    #    checkpoint written by torch.optim.NAdam would load the same way, and vice versa).
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    dcp.save(state, checkpoint_id=checkpoint_dir)

    resumed = make_model()
    for layer in resumed:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(resumed, mesh=mesh)
    resumed_optimizer = torch.optim.NAdam(
        resumed.parameters(), lr=1e-2
    )  # torch's class, funcopt's checkpoint
    loaded = {
        "model": get_model_state_dict(resumed),
        "optim": get_optimizer_state_dict(resumed, resumed_optimizer),
    }
    dcp.load(loaded, checkpoint_id=checkpoint_dir)
    set_model_state_dict(resumed, loaded["model"])
    set_optimizer_state_dict(resumed, resumed_optimizer, loaded["optim"])
    full = get_optimizer_state_dict(
        resumed, resumed_optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if rank == 0:
        print(
            f"checkpoint reloaded into torch.optim.NAdam: step {int(full['state']['0.weight']['step'])}, keys {sorted(full['state']['0.weight'])}"
        )

    # 4. The functional API on DTensors: state sharded like the params, no communication.
    params = {"w": distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])}
    tx = fo.adamax(lr=1e-2)
    opt_state = tx.init(params)
    grads = {"w": distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])}
    updates, opt_state = tx.update(grads, opt_state, params)
    params = fo.apply_updates(params, updates)
    if rank == 0:
        print(
            f"functional adamax on a DTensor: exp_inf {opt_state.exp_inf['w'].placements}, params {params['w'].placements}"
        )

    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as directory:
        mp.spawn(main, args=(2, port, directory), nprocs=2, join=True)
