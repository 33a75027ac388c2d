"""Worker functions for tests/test_distributed.py, each run on 2 CPU processes (gloo,
127.0.0.1) for each of `algorithms` (names of classes funcopt exports). Each worker
records, per algorithm, on each rank, whether it passed, was skipped (torch.optim's own
class fails in that setting too: `Unsupported`) or failed (the traceback); the test
reads the records (see `each`)."""

from __future__ import annotations

import copy
import datetime
import functools
import inspect
import json
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import HYPER, algorithm, factory, kwargs_of, matrices_only

import funcopt as fo

F64 = torch.float64
TOL = {"rtol": 1e-7, "atol": 1e-9}


class Unsupported(Exception):
    """torch.optim's own class fails in this setting too: the algorithm is skipped there."""


def setup(rank: int, world: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)


def teardown() -> None:
    dist.barrier()
    dist.destroy_process_group()


def each(rank: int, results: str, cases: dict[str, Callable[[], None]]) -> None:
    """Run every case, writing ``{case: [outcome, detail, seconds]}`` to
    ``results/<rank>.json``: "passed", "skipped" (`Unsupported`, with the reason) or
    "failed" (with the traceback). The first failure ends the worker: the other rank
    may wait in a collective that this one will not join (spawn then stops it)."""
    outcomes: dict[str, list[Any]] = {}
    try:
        for key, case in cases.items():
            start = time.perf_counter()
            try:
                case()
            except Unsupported as e:
                outcomes[key] = ["skipped", str(e), time.perf_counter() - start]
            else:
                outcomes[key] = ["passed", "", time.perf_counter() - start]
    except Exception:
        outcomes[key] = ["failed", traceback.format_exc(), time.perf_counter() - start]
        raise
    finally:
        Path(results, f"{rank}.json").write_text(json.dumps(outcomes))


def agreed(run: Callable[[], Any]) -> tuple[Any, str | None]:
    """``(run(), None)``, or ``(None, error)`` where it fails on any rank (the first
    failing rank's error): the ranks agree on it."""
    result, error = None, None
    try:
        result = run()
    except Exception as e:
        error = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
    errors: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    failed = [e for e in errors if e]
    return (None, failed[0]) if failed else (result, None)


def by_torch(name: str, run: Callable[[], Any]) -> Any:
    """``run()``, a run of torch.optim's class `name`; where it fails, the algorithm is
    `Unsupported` here (with torch's error)."""
    result, error = agreed(run)
    if error is not None:
        raise Unsupported(f"torch.optim.{name} fails here too: {error}")
    return result


def configs(name: str) -> list[dict[str, Any]]:
    """The classes' defaults, then `name`'s test values (helpers.HYPER: every
    hyperparameter away from its default; SGD's momentum creates its buffer)."""
    return [{}, kwargs_of(HYPER[name])]


def make_model(seed: int = 0, bias: bool = True) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16, bias=bias), torch.nn.Tanh(), torch.nn.Linear(16, 3, bias=bias)
    ).to(F64)


def model_for(name: str, seed: int = 0) -> torch.nn.Module:
    """The model, without biases for a class that steps matrices only (Muon)."""
    return make_model(seed, bias=not matrices_only(name))


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


def full(t: Any) -> Any:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def assert_params_close(a, b) -> None:
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(full(p).detach(), full(q).detach(), **TOL)


# -- DDP ------------------------------------------------------------------------


def ddp(rank: int, world: int, port: int, algorithms: list[str], results: str) -> None:
    """funcopt.X under DistributedDataParallel = torch.optim.X under DDP = one process on
    the global batch."""
    setup(rank, world, port)
    from torch.nn.parallel import DistributedDataParallel as DDP

    batches = global_batches(6)

    def case(name: str) -> None:
        for config in configs(name):
            runs = {}
            for label, cls in (("torch", getattr(torch.optim, name)), ("funcopt", getattr(fo, name))):
                model = DDP(model_for(name))
                train(model, cls(model.parameters(), **config), local_half(batches, rank, world))
                runs[label] = list(model.module.parameters())
            single = model_for(name)
            train(single, getattr(fo, name)(single.parameters(), **config), batches)
            assert_params_close(runs["funcopt"], runs["torch"])
            assert_params_close(runs["funcopt"], list(single.parameters()))

    each(rank, results, {name: lambda name=name: case(name) for name in algorithms})
    teardown()


def zero(rank: int, world: int, port: int, algorithms: list[str], results: str) -> None:
    """funcopt.X as ZeroRedundancyOptimizer's ``optimizer_class`` (each rank keeps the
    state of its share of the params) = torch.optim.X there. The consolidated state_dict
    equals torch's, and a run resumed from it in the other library's ZeRO goes on as the
    uninterrupted run."""
    setup(rank, world, port)
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    libraries = {"torch": torch.optim, "funcopt": fo}
    batches = local_half(global_batches(6), rank, world)

    def case(name: str) -> None:
        for config in configs(name):
            config = {"lr": 0.05, **config}
            runs, saved = {}, {}
            for label, library in libraries.items():
                model = DDP(model_for(name))
                optimizer = ZeroRedundancyOptimizer(
                    model.parameters(), optimizer_class=getattr(library, name), **config
                )
                train(model, optimizer, batches[:3])
                optimizer.consolidate_state_dict(to=0)
                # copied: a state_dict holds the live state tensors, which training goes on to change
                state = [copy.deepcopy(optimizer.state_dict()) if rank == 0 else None]
                dist.broadcast_object_list(state, src=0)
                saved[label] = (copy.deepcopy(model.module.state_dict()), state[0])
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
                model = model_for(name)
                model.load_state_dict(model_state)
                model = DDP(model)
                optimizer = ZeroRedundancyOptimizer(
                    model.parameters(), optimizer_class=getattr(library, name), **config
                )
                optimizer.load_state_dict(copy.deepcopy(optimizer_state))  # ZeRO keeps its tensors
                train(model, optimizer, batches[3:])
                assert_params_close(list(model.module.parameters()), runs[label])

    each(rank, results, {name: lambda name=name: case(name) for name in algorithms})
    teardown()


# -- FSDP2 ------------------------------------------------------------------------


def sharded_model(mesh, seed: int = 0, bias: bool = True) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    model = make_model(seed, bias)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def sharded_model_for(name: str, mesh, seed: int = 0) -> torch.nn.Module:
    return sharded_model(mesh, seed, bias=not matrices_only(name))


def fsdp(rank: int, world: int, port: int, algorithms: list[str], results: str) -> None:
    """funcopt.X on FSDP2 (fully_shard, DTensor params) = torch.optim.X; the state is
    sharded like the params. Then a chain (fo.Optimizer) with a global-norm clip."""
    setup(rank, world, port)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    mesh = init_device_mesh("cpu", (world,))
    batches = local_half(global_batches(5), rank, world)

    def run(cls, name: str, config: dict[str, Any]):
        model = sharded_model_for(name, mesh)
        optimizer = cls(model.parameters(), **config)
        train(model, optimizer, batches)
        return list(model.parameters()), optimizer

    def case(name: str) -> None:
        for config in configs(name):
            torch_run, torch_error = agreed(functools.partial(run, getattr(torch.optim, name), name, config))
            if torch_error is not None:
                # torch's class fails here: funcopt's, where it steps such params, does as on one process
                ours_run, error = agreed(functools.partial(run, getattr(fo, name), name, config))
                if error is not None:
                    raise Unsupported(f"torch.optim.{name} fails here too: {torch_error}; funcopt's: {error}")
                single = model_for(name)
                train(single, getattr(fo, name)(single.parameters(), **config), global_batches(5))
                assert_params_close(ours_run[0], list(single.parameters()))
                continue
            theirs_params, theirs = torch_run
            ours_params, ours = run(getattr(fo, name), name, config)
            assert_params_close(ours_params, theirs_params)
            for p, q in zip(ours_params, theirs_params, strict=True):
                assert ours.state[p].keys() == theirs.state[q].keys()
                for key, value in ours.state[p].items():
                    if value.shape == p.shape:  # buffers shaped like the param: sharded like it
                        assert isinstance(value, DTensor) and value.placements == p.placements, key
                    torch.testing.assert_close(full(value), full(theirs.state[q][key]), **TOL)

    def chain() -> None:
        # a chain as a torch optimizer (fo.Optimizer, the functional path) on DTensor params:
        # the global norm is computed across shards, as torch's clip_grad_norm_ does
        models = [sharded_model(mesh), sharded_model(mesh)]
        optimizers = [
            torch.optim.NAdam(models[0].parameters(), lr=0.05),
            fo.Optimizer(
                models[1].parameters(),
                lambda lr: fo.chain(fo.clip_by_global_norm(0.1), fo.nadam(lr=lr)),
                lr=0.05,
            ),
        ]
        for x, y in batches:
            for model, optimizer in zip(models, optimizers):
                optimizer.zero_grad()
                F.mse_loss(model(x), y).backward()
                if optimizer is optimizers[0]:  # optax's rule, fo.clip_by_global_norm's (no 1e-6)
                    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
                    torch._foreach_mul_(
                        [p.grad for p in model.parameters()], 0.1 / torch.clamp(norm, min=0.1)
                    )
                optimizer.step()
        assert_params_close(list(models[1].parameters()), list(models[0].parameters()))

    each(rank, results, {**{name: lambda name=name: case(name) for name in algorithms}, "chain": chain})
    teardown()


# -- the functional API on DTensors -------------------------------------------------


def functional_dtensor(rank: int, world: int, port: int, algorithms: list[str], results: str) -> None:
    """tx.init/tx.update (the test values, helpers.HYPER) on sharded params: the buffers
    shaped like the params are sharded like them, and the result is the one on full
    tensors. A per-element algorithm communicates nothing; a per-tensor one (norms,
    matrix products: Adafactor, Muon) gathers what its math needs, through DTensor. An
    algorithm whose update fails on DTensors is skipped where torch's class fails on
    them too (tried then), else fails."""
    setup(rank, world, port)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    mesh = init_device_mesh("cpu", (world,))
    shard = lambda t: distribute_tensor(t, mesh, [Shard(0)])  # noqa: E731

    def case(name: str) -> None:
        g = torch.Generator().manual_seed(0)
        full_params = {
            "w": torch.randn(8, 5, generator=g, dtype=F64),
            # a matrix for a class that steps matrices only (Muon)
            "b": torch.randn((6, 3) if matrices_only(name) else (6,), generator=g, dtype=F64),
        }
        full_grads = [
            {k: torch.randn(v.shape, generator=g, dtype=F64) for k, v in full_params.items()}
            for _ in range(4)
        ]
        sharded_grads = [{k: shard(v) for k, v in grads.items()} for grads in full_grads]

        def torch_step() -> None:  # whether torch's class steps such params at all
            params = [torch.nn.Parameter(shard(v)) for v in full_params.values()]
            optimizer = getattr(torch.optim, name)(params, **kwargs_of(HYPER[name]))
            for p, grad in zip(params, sharded_grads[0].values()):
                p.grad = grad
            optimizer.step()

        kwargs = kwargs_of(HYPER[name])
        if "ns_dtype" in inspect.signature(factory(name)).parameters:
            # Newton-Schulz (Muon) in float64: a sharded matrix product sums in another
            # order than a full one, which torch's bfloat16 rounds apart
            kwargs["ns_dtype"] = F64
        tx = factory(name)(**kwargs)
        params = {k: shard(v) for k, v in full_params.items()}

        def sharded_steps() -> tuple[Any, Any, Any]:
            state = tx.init(params)
            stepped = params
            with CommDebugMode() as comms:
                for grads in sharded_grads:
                    updates, state = tx.update(grads, state, stepped)
                    stepped = fo.apply_updates(stepped, updates)
            return stepped, state, comms

        result, error = agreed(sharded_steps)
        if error is not None:  # a failure where torch's class fails as well is no bug of ours
            by_torch(name, torch_step)
            raise AssertionError(
                f"fo.{factory(name).__name__} fails on DTensors (torch's class does not): {error}"
            )
        params, state, comms = result
        if algorithm(name).per_element:
            assert comms.get_total_counts() == 0, comms.get_comm_counts()
        own = state.inner_state if isinstance(state, fo.ScheduledState) else state  # (SGD's dampening)
        for field in own._fields:
            for k, value in getattr(own, field).items():
                if isinstance(value, torch.Tensor) and value.shape == full_params[k].shape:
                    assert value.placements == (Shard(0),), (field, k)
        reference = dict(full_params)
        ref_state = tx.init(reference)
        for grads in full_grads:
            updates, ref_state = tx.update(grads, ref_state, reference)
            reference = fo.apply_updates(reference, updates)
        for k in reference:
            torch.testing.assert_close(params[k].full_tensor(), reference[k], **TOL)

    each(rank, results, {name: lambda name=name: case(name) for name in algorithms})
    teardown()


# -- torch.distributed.checkpoint ---------------------------------------------------


def dcp(rank: int, world: int, port: int, algorithms: list[str], results: str) -> None:
    """get/set_optimizer_state_dict (sharded, full, cpu_offload, broadcast_from_rank0) and
    dcp.save/dcp.load round-trip funcopt's state, between funcopt.X and torch.optim.X in
    both directions; the state-creating lr=0 step on a fresh optimizer is a no-op. The
    checkpoints go to `results`."""
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
    offloaded = StateDictOptions(full_state_dict=True, cpu_offload=True)

    def case(name: str) -> None:
        ours_cls, torch_cls = getattr(fo, name), getattr(torch.optim, name)
        config = kwargs_of(HYPER[name])

        def src_run(cls):
            model = sharded_model_for(name, mesh)
            optimizer = cls(model.parameters(), **config)
            train(model, optimizer, batches[:3])
            return model, optimizer

        by_torch(name, lambda: src_run(torch_cls))

        # a fresh optimizer: the state-creating step (lr=0, zero grads) changes no param
        model = sharded_model_for(name, mesh)
        before = [p.full_tensor().clone() for p in model.parameters()]
        optimizer = ours_cls(model.parameters(), lr=0.05)
        get_optimizer_state_dict(model, optimizer)
        assert_params_close(list(model.parameters()), before)
        assert optimizer.param_groups[0]["lr"] == 0.05

        for src_cls, dst_cls in ((ours_cls, torch_cls), (torch_cls, ours_cls)):
            # train, save with dcp, load into the other class, train both on
            model, optimizer = src_run(src_cls)
            path = os.path.join(results, f"{name}-{src_cls.__module__}")
            state = {
                "model": get_model_state_dict(model),
                "optim": get_optimizer_state_dict(model, optimizer),
            }
            dcp_api.save(state, checkpoint_id=path)

            model2 = sharded_model_for(name, mesh, seed=1)
            # the same options but lr, which the checkpoint restores: a sharded load fills the
            # state that the options make (RMSprop's momentum_buffer only with momentum)
            optimizer2 = dst_cls(model2.parameters(), **{**config, "lr": 0.5})
            loaded = {
                "model": get_model_state_dict(model2),
                "optim": get_optimizer_state_dict(model2, optimizer2),
            }
            dcp_api.load(loaded, checkpoint_id=path)
            set_model_state_dict(model2, loaded["model"])
            set_optimizer_state_dict(model2, optimizer2, loaded["optim"])
            assert optimizer2.param_groups[0]["lr"] == config["lr"]
            train(model, optimizer, batches[3:])
            train(model2, optimizer2, batches[3:])
            assert_params_close(list(model2.parameters()), list(model.parameters()))

            # full state dict on CPU, loaded by broadcast from rank 0 into both classes:
            # the state round-trips, and both continue identically
            full_sd = get_optimizer_state_dict(model, optimizer, options=offloaded)  # on rank 0 only
            if rank == 0:
                assert all(
                    not hasattr(v, "placements") for s in full_sd["state"].values() for v in s.values()
                )
            broadcast = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            model_sd = get_model_state_dict(model, options=offloaded)
            runs = []
            for cls in (ours_cls, torch_cls):
                model3 = sharded_model_for(name, mesh, seed=2)
                # (loading consumes the dicts it is given: each class gets its own copy)
                set_model_state_dict(model3, copy.deepcopy(model_sd) if rank == 0 else {}, options=broadcast)
                optimizer3 = cls(model3.parameters(), **{**config, "lr": 0.5})
                set_optimizer_state_dict(
                    model3, optimizer3, copy.deepcopy(full_sd) if rank == 0 else {}, options=broadcast
                )
                loaded = get_optimizer_state_dict(model3, optimizer3, options=offloaded)
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

    each(rank, results, {name: lambda name=name: case(name) for name in algorithms})
    teardown()
