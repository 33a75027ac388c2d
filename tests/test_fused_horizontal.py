"""``fused=True`` as one compiled graph per group (funcopt/_src/torch/fused_lists.py).

Each per-element class whose fused step is funcopt's own (not torch's kernels) steps in
the list graph as its default (unfused) class does, to float rounding, in float32 and
float64, with an LR scheduler changing the lr. New hyperparameters and the growing step
count run the graph already compiled; a new set of params compiles another. A
GradScaler's scale and inf flag act as on the unfused class, and state dicts load both
ways.

Compiling a graph costs seconds: the tests share them (one set of param shapes, the
classes' `HYPER` configurations), and graphs are kept for the whole process.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from helpers import HYPER, assert_same, fo_cls, kwargs_of

import funcopt as fo
from funcopt._src.torch import fused, fused_lists


@pytest.fixture(autouse=True)
def lists_on_cpu(monkeypatch):
    """CPU params in the list graph (by default they take fused.py's per-param kernels)."""
    monkeypatch.setattr(fused_lists, "LISTS_ON_CPU", True)


LISTED = ["Adadelta", "Adamax", "ASGD", "NAdam", "RAdam", "RMSprop", "Rprop"]
"""The classes torch has no fused step for (SGD, Adam, AdamW and Adagrad take torch's
kernels; Adafactor's and Muon's math is not per element)."""
STEPS = 5
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def make_params(dtype: torch.dtype = torch.float32, device: str = "cpu") -> list[torch.nn.Parameter]:
    """Params of several shapes: a matrix, a vector, a 3-d one, a 0-d one, and a
    transposed one (its gradients too)."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen, dtype=dtype) for s in [(6, 5), (7,), (2, 3, 4), ()]]
    params.append(torch.randn(4, 6, generator=gen, dtype=dtype).t())
    return [torch.nn.Parameter(p.to(device)) for p in params]


def train(
    opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], steps: int = STEPS, seed: int = 1
) -> None:
    """`steps` steps on random gradients shaped and strided as their params, the lr
    halved every other step by a scheduler."""
    gen = torch.Generator().manual_seed(seed)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(steps):
        for p in params:
            g = torch.randn(p.t().shape if not p.is_contiguous() else p.shape, generator=gen, dtype=p.dtype)
            p.grad = (g.t() if not p.is_contiguous() else g).to(p.device)
        opt.step()
        scheduler.step()


def counters_float64(state_dict: dict) -> dict:
    """A state dict without the group's fused flag, its 0-d tensors (the counters,
    float32 where fused) as float64."""
    groups = [{k: v for k, v in g.items() if k != "fused"} for g in state_dict["param_groups"]]
    state = {
        i: {k: v.double() if isinstance(v, torch.Tensor) and v.dim() == 0 else v for k, v in s.items()}
        for i, s in state_dict["state"].items()
    }
    return {**state_dict, "param_groups": groups, "state": state}


def graphs_of(name: str) -> int:
    return sum(key[0].name == name for key in fused_lists._GRAPHS)


def stepped(name: str, dtype: torch.dtype, device: str, **flags) -> tuple[list[torch.Tensor], dict]:
    params = make_params(dtype, device)
    opt = fo_cls(name)(params, **kwargs_of(HYPER[name]), **flags)
    train(opt, params)
    return [p.detach() for p in params], counters_float64(opt.state_dict())


SHARED = ("NAdam", "RMSprop")
"""The classes whose graph (float32, on the CPU) the other tests reuse: the others' cases
each compile a graph of their own (seconds to a minute on a loaded machine), slow."""


def cases() -> list:
    return [
        pytest.param(
            name,
            dtype,
            device,
            marks=() if (name, dtype, device) in fast else pytest.mark.slow,
            id=f"{name}-{str(dtype)[6:]}-{device}",
        )
        for fast in [{(name, torch.float32, "cpu") for name in SHARED}]
        for name in LISTED
        for dtype in (torch.float32, torch.float64)
        for device in DEVICES
    ]


@pytest.mark.parametrize("name, dtype, device", cases())
def test_the_graph_steps_as_the_unfused_class(name, dtype, device):
    kernels = len(fused._KERNELS)
    ours, ours_state = stepped(name, dtype, device, fused=True)
    assert graphs_of(name) >= 1 and len(fused._KERNELS) == kernels  # the list graph, no per-param kernel
    ref, ref_state = stepped(name, dtype, device)
    tol = {} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    assert_same(ours, ref, **tol)
    assert_same(ours_state, ref_state, **tol)


def test_no_recompile_as_hyperparameters_change_and_steps_go_by():
    """New lr, betas, momentum_decay and eps through `param_groups`, and the growing
    step count, run the graph compiled at the first step."""
    params = make_params()
    opt = fo.NAdam(params, **kwargs_of(HYPER["NAdam"]), fused=True)
    train(opt, params, steps=1)
    assert graphs_of("NAdam") >= 1
    before = (len(fused_lists._GRAPHS), torch._dynamo.utils.counters["stats"]["unique_graphs"])
    opt.param_groups[0].update(lr=0.003, betas=(0.8, 0.95), momentum_decay=0.01, eps=1e-3)
    train(opt, params, steps=4, seed=2)
    assert (len(fused_lists._GRAPHS), torch._dynamo.utils.counters["stats"]["unique_graphs"]) == before
    assert opt.state[params[0]]["step"] == 5

    # the same steps without fused, for the values
    ref_params = make_params()
    ref = fo.NAdam(ref_params, **kwargs_of(HYPER["NAdam"]))
    train(ref, ref_params, steps=1)
    ref.param_groups[0].update(lr=0.003, betas=(0.8, 0.95), momentum_decay=0.01, eps=1e-3)
    train(ref, ref_params, steps=4, seed=2)
    assert_same([p.detach() for p in params], [p.detach() for p in ref_params])


def test_a_new_set_of_params_compiles_another_graph():
    """A step where a param has no gradient is a step of the others: another list, so
    another graph; the first one serves the full list again afterwards."""

    def scenario(**flags):
        params = make_params()
        opt = fo.RMSprop(params, **kwargs_of(HYPER["RMSprop"]), **flags)
        train(opt, params, steps=2)
        params[1].grad = None
        opt.step()
        train(opt, params, steps=2, seed=3)
        return [p.detach() for p in params], counters_float64(opt.state_dict())

    graphs = graphs_of("RMSprop")
    ours = scenario(fused=True)
    assert graphs_of("RMSprop") - graphs in (1, 2)  # (the full list's may have been compiled before)
    assert_same(ours, scenario())


def test_grad_scaler_hands_the_graph_its_scale():
    """With a GradScaler, the step that overflowed changes nothing and the others step
    on unscaled gradients, as the unfused class under the scaler's own unscaling."""

    def scenario(**flags):
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 3)
        opt = fo.Adamax(m.parameters(), lr=0.1, **flags)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        for i in range(4):
            opt.zero_grad()
            loss = m(torch.randn(2, 4)).square().sum()
            scaler.scale(loss * (float("inf") if i == 1 else 1.0)).backward()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the scheduler-less step order warning
                scaler.step(opt)
            scaler.update()
        return [p.detach() for p in m.parameters()], counters_float64(opt.state_dict())

    graphs = graphs_of("Adamax")
    assert_same(scenario(fused=True), scenario())
    assert graphs_of("Adamax") > graphs


def test_state_dict_round_trip():
    """A fused optimizer's state dict loads into a fused, an unfused and torch's class,
    which then step on alike; an unfused one's loads into a fused one."""
    params = make_params()
    source = fo.RMSprop(params, **kwargs_of(HYPER["RMSprop"]), fused=True)
    train(source, params, steps=2)
    saved = source.state_dict()
    results = []
    for make in (
        lambda ps: fo.RMSprop(ps, fused=True),
        lambda ps: fo.RMSprop(ps),
        lambda ps: torch.optim.RMSprop(ps),
    ):
        copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
        opt = make(copies)
        opt.load_state_dict(copy.deepcopy(saved))
        train(opt, copies, steps=2, seed=3)
        results.append([p.detach() for p in copies])
    for other in results[1:]:
        assert_same(other, results[0])
    plain = fo.RMSprop(make_params(), **kwargs_of(HYPER["RMSprop"]))
    train(plain, plain.param_groups[0]["params"], steps=2)
    into = fo.RMSprop(make_params(), fused=True)
    into.load_state_dict(plain.state_dict())
    assert_same(counters_float64(into.state_dict()), counters_float64(plain.state_dict()))


def test_a_model_converted_after_its_state_was_made_fails_as_per_param(monkeypatch):
    """Params converted to float64 after their float32 state was made: the graph's step
    raises what fused.py's per-param step raises (naming the cause), before any param
    changes. (The unfused class steps on, as torch's does, its in-place ops casting.)"""
    outcomes = []
    for lists in (True, False):
        monkeypatch.setattr(fused_lists, "LISTS_ON_CPU", lists)
        params = make_params()
        opt = fo.RMSprop(params, **kwargs_of(HYPER["RMSprop"]), fused=True)
        train(opt, params, steps=1)
        for p in params:
            p.data = p.data.double()
        before = [p.detach().clone() for p in params]
        with pytest.raises(RuntimeError, match="the model was converted") as error:
            train(opt, params, steps=1)
        assert_same([p.detach() for p in params], before)
        outcomes.append(str(error.value))
    assert outcomes[0] == outcomes[1]
