"""Worker functions for tests/test_distributed.py, each run on 2 CPU processes (gloo,
127.0.0.1) for each of `algorithms` (the classes funcopt exports). They assert inside
the workers; a failure fails the spawning test."""

from __future__ import annotations

import copy
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import funcopt as fo

CONFIGS = [{}, {"weight_decay": 0.05, "maximize": False}]
F64 = torch.float64
TOL = {"rtol": 1e-7, "atol": 1e-9}


def setup(rank: int, world: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)


def teardown() -> None:
    dist.barrier()
    dist.destroy_process_group()


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(F64)


def global_batches(steps: int, batch: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1234)
    return [
        (torch.randn(batch, 6, generator=g, dtype=F64), torch.randn(batch, 3, generator=g, dtype=F64))
        for _ in range(steps)
    ]


def train(model, optimizer, batches) -> None:
    for x, y in batches:
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()


def local_half(batches, rank: int, world: int):
    return [(x.chunk(world)[rank], y.chunk(world)[rank]) for x, y in batches]


def assert_params_close(a, b) -> None:
    for p, q in zip(a, b, strict=True):
        p = p.full_tensor() if hasattr(p, "full_tensor") else p
        q = q.full_tensor() if hasattr(q, "full_tensor") else q
        torch.testing.assert_close(p.detach(), q.detach(), **TOL)


# -- DDP ------------------------------------------------------------------------


def ddp(rank: int, world: int, port: int, algorithms: list[str]) -> None:
    """funcopt.X under DistributedDataParallel = torch.optim.X under DDP = one process on
    the global batch."""
    setup(rank, world, port)
    from torch.nn.parallel import DistributedDataParallel as DDP

    batches = global_batches(6)
    for name in algorithms:
        for config in CONFIGS:
            runs = {}
            for label, cls in (("torch", getattr(torch.optim, name)), ("funcopt", getattr(fo, name))):
                model = DDP(make_model())
                train(model, cls(model.parameters(), **config), local_half(batches, rank, world))
                runs[label] = list(model.module.parameters())
            single = make_model()
            train(single, getattr(fo, name)(single.parameters(), **config), batches)
            assert_params_close(runs["funcopt"], runs["torch"])
            assert_params_close(runs["funcopt"], list(single.parameters()))
    teardown()


def zero(rank: int, world: int, port: int, algorithms: list[str]) -> None:
    """funcopt.X as ZeroRedundancyOptimizer's ``optimizer_class`` (each rank keeps the
    state of its share of the params) = torch.optim.X there. The consolidated state_dict
    equals torch's, and a run resumed from it in the other library's ZeRO goes on as the
    uninterrupted run."""
    setup(rank, world, port)
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    libraries = {"torch": torch.optim, "funcopt": fo}
    batches = local_half(global_batches(6), rank, world)
    for name in algorithms:
        for config in CONFIGS:
            runs, saved = {}, {}
            for label, library in libraries.items():
                model = DDP(make_model())
                optimizer = ZeroRedundancyOptimizer(
                    model.parameters(), optimizer_class=getattr(library, name), lr=0.05, **config
                )
                train(model, optimizer, batches[:3])
                optimizer.consolidate_state_dict(to=0)
                # copied: a state_dict holds the live state tensors, which training goes on to change
                full = [copy.deepcopy(optimizer.state_dict()) if rank == 0 else None]
                dist.broadcast_object_list(full, src=0)
                saved[label] = (copy.deepcopy(model.module.state_dict()), full[0])
                train(model, optimizer, batches[3:])
                runs[label] = list(model.module.parameters())
            assert_params_close(runs["funcopt"], runs["torch"])
            for i, theirs in saved["torch"][1]["state"].items():
                ours = saved["funcopt"][1]["state"][i]
                assert ours.keys() == theirs.keys()
                for key in ours:
                    torch.testing.assert_close(ours[key], theirs[key], **TOL)
            for label, library in libraries.items():  # resumed from the other's checkpoint
                model_state, optimizer_state = saved["funcopt" if label == "torch" else "torch"]
                model = make_model()
                model.load_state_dict(model_state)
                model = DDP(model)
                optimizer = ZeroRedundancyOptimizer(
                    model.parameters(), optimizer_class=getattr(library, name), lr=0.05, **config
                )
                optimizer.load_state_dict(copy.deepcopy(optimizer_state))  # ZeRO keeps its tensors
                train(model, optimizer, batches[3:])
                assert_params_close(list(model.module.parameters()), runs[label])
    teardown()


# -- FSDP2 ------------------------------------------------------------------------


def sharded_model(mesh, seed: int = 0) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    model = make_model(seed)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def fsdp(rank: int, world: int, port: int, algorithms: list[str]) -> None:
    """funcopt.X on FSDP2 (fully_shard, DTensor params) = torch.optim.X; the state is
    sharded like the params."""
    setup(rank, world, port)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    mesh = init_device_mesh("cpu", (world,))
    batches = local_half(global_batches(5), rank, world)
    for name in algorithms:
        for config in CONFIGS:
            runs, optimizers = {}, {}
            for label, cls in (("torch", getattr(torch.optim, name)), ("funcopt", getattr(fo, name))):
                model = sharded_model(mesh)
                optimizer = cls(model.parameters(), **config)
                train(model, optimizer, batches)
                runs[label], optimizers[label] = list(model.parameters()), optimizer
            assert_params_close(runs["funcopt"], runs["torch"])
            for p, q in zip(runs["funcopt"], runs["torch"], strict=True):
                ours, theirs = optimizers["funcopt"].state[p], optimizers["torch"].state[q]
                assert ours.keys() == theirs.keys()
                for key, value in ours.items():
                    if value.dim() > 0:  # buffers: sharded like the param
                        assert isinstance(value, DTensor) and value.placements == p.placements, key
                    torch.testing.assert_close(
                        value.full_tensor() if isinstance(value, DTensor) else value,
                        theirs[key].full_tensor() if isinstance(theirs[key], DTensor) else theirs[key],
                        **TOL,
                    )

    # a chain as a torch optimizer (fo.Optimizer, the functional path) on DTensor params:
    # the global norm is computed across shards, as torch's clip_grad_norm_ does
    models = [sharded_model(mesh), sharded_model(mesh)]
    optimizers = [
        torch.optim.NAdam(models[0].parameters(), lr=0.05),
        fo.Optimizer(
            models[1].parameters(), lambda lr: fo.chain(fo.clip_by_global_norm(0.1), fo.nadam(lr=lr)), lr=0.05
        ),
    ]
    for x, y in batches:
        for model, optimizer in zip(models, optimizers):
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            if optimizer is optimizers[0]:  # optax's rule, fo.clip_by_global_norm's (no 1e-6)
                norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
                torch._foreach_mul_([p.grad for p in model.parameters()], 0.1 / torch.clamp(norm, min=0.1))
            optimizer.step()
    assert_params_close(list(models[1].parameters()), list(models[0].parameters()))
    teardown()


# -- the functional API on DTensors -------------------------------------------------


def functional_dtensor(rank: int, world: int, port: int, algorithms: list[str]) -> None:
    """tx.init/tx.update on sharded params: state sharded like the params, no
    communication, and the same result as on full tensors."""
    setup(rank, world, port)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    full_params = {
        "w": torch.randn(8, 5, generator=g, dtype=F64),
        "b": torch.randn(6, generator=g, dtype=F64),
    }
    full_grads = [
        {k: torch.randn(v.shape, generator=g, dtype=F64) for k, v in full_params.items()} for _ in range(4)
    ]
    shard = lambda t: distribute_tensor(t, mesh, [Shard(0)])  # noqa: E731
    for name in algorithms:
        tx = getattr(fo, name.lower())(weight_decay=0.05)
        params = {k: shard(v) for k, v in full_params.items()}
        state = tx.init(params)
        for field in state._fields:
            if field not in ("step", "mu_product"):  # buffers, sharded like the params
                assert all(t.placements == (Shard(0),) for t in getattr(state, field).values()), name
        reference, ref_state = dict(full_params), tx.init(full_params)
        sharded_grads = [{k: shard(v) for k, v in grads.items()} for grads in full_grads]
        with CommDebugMode() as comms:
            for grads in sharded_grads:
                updates, state = tx.update(grads, state, params)
                params = fo.apply_updates(params, updates)
        assert comms.get_total_counts() == 0, (name, comms.get_comm_counts())
        for grads in full_grads:
            updates, ref_state = tx.update(grads, ref_state, reference)
            reference = fo.apply_updates(reference, updates)
        for k in reference:
            torch.testing.assert_close(params[k].full_tensor(), reference[k], **TOL)
    teardown()


# -- torch.distributed.checkpoint ---------------------------------------------------


def dcp(rank: int, world: int, port: int, algorithms: list[str], directory: str) -> None:
    """get/set_optimizer_state_dict (sharded, full, cpu_offload, broadcast_from_rank0) and
    dcp.save/dcp.load round-trip funcopt's state, between funcopt.X and torch.optim.X in
    both directions; the state-creating lr=0 step on a fresh optimizer is a no-op."""
    setup(rank, world, port)
    import torch.distributed.checkpoint as dcp_api
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    batches = local_half(global_batches(6), rank, world)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    for name in algorithms:
        ours_cls, torch_cls = getattr(fo, name), getattr(torch.optim, name)

        # a fresh optimizer: the state-creating step (lr=0, zero grads) changes no param
        model = sharded_model(mesh)
        before = [p.full_tensor().clone() for p in model.parameters()]
        optimizer = ours_cls(model.parameters(), lr=0.05)
        get_optimizer_state_dict(model, optimizer)
        assert_params_close(list(model.parameters()), before)
        assert optimizer.param_groups[0]["lr"] == 0.05

        for src_cls, dst_cls in ((ours_cls, torch_cls), (torch_cls, ours_cls)):
            # train, save with dcp, load into the other class, train both on
            model = sharded_model(mesh)
            optimizer = src_cls(model.parameters(), lr=0.05, weight_decay=0.01)
            train(model, optimizer, batches[:3])
            path = os.path.join(directory, f"{name}-{src_cls.__module__}")
            state = {
                "model": get_model_state_dict(model),
                "optim": get_optimizer_state_dict(model, optimizer),
            }
            dcp_api.save(state, checkpoint_id=path)

            model2 = sharded_model(mesh, seed=1)
            optimizer2 = dst_cls(model2.parameters(), lr=0.5)
            loaded = {
                "model": get_model_state_dict(model2),
                "optim": get_optimizer_state_dict(model2, optimizer2),
            }
            dcp_api.load(loaded, checkpoint_id=path)
            set_model_state_dict(model2, loaded["model"])
            set_optimizer_state_dict(model2, optimizer2, loaded["optim"])
            assert optimizer2.param_groups[0]["lr"] == 0.05
            train(model, optimizer, batches[3:])
            train(model2, optimizer2, batches[3:])
            assert_params_close(list(model2.parameters()), list(model.parameters()))

            # full state dict on CPU, loaded by broadcast from rank 0 into both classes:
            # the state round-trips, and both continue identically
            full_sd = get_optimizer_state_dict(model, optimizer, options=full)  # on rank 0 only
            if rank == 0:
                assert all(
                    not hasattr(v, "placements") for s in full_sd["state"].values() for v in s.values()
                )
            broadcast = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            model_sd = get_model_state_dict(model, options=full)
            runs = []
            for cls in (ours_cls, torch_cls):
                model3 = sharded_model(mesh, seed=2)
                # (loading consumes the dicts it is given: each class gets its own copy)
                set_model_state_dict(model3, copy.deepcopy(model_sd) if rank == 0 else {}, options=broadcast)
                optimizer3 = cls(model3.parameters(), lr=0.5)
                set_optimizer_state_dict(
                    model3, optimizer3, copy.deepcopy(full_sd) if rank == 0 else {}, options=broadcast
                )
                loaded = get_optimizer_state_dict(model3, optimizer3, options=full)
                if rank == 0:
                    assert loaded["state"].keys() == full_sd["state"].keys()
                    for fqn, s in full_sd["state"].items():
                        for key, value in s.items():
                            torch.testing.assert_close(
                                loaded["state"][fqn][key], value, check_dtype=False, **TOL
                            )
                train(model3, optimizer3, batches[:2])
                runs.append(list(model3.parameters()))
            assert_params_close(*runs)
    teardown()
