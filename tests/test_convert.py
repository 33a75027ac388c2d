"""fo.functional_state and fo.load_functional_state: a run switches between a
torch-format optimizer (torch.optim.X, fo.X, fo.Optimizer) and the functional update
mid-training and goes on as the uninterrupted run does: bit for bit on the class face,
within float32 round-off where functional steps ran. Every class funcopt exports that
torch.optim has (discovered as tests/helpers.py does)."""

from __future__ import annotations

from typing import Any

import optree
import pytest
import torch
from helpers import ALGORITHMS, HYPER, INFOS, assert_same, factory, fo_cls, kwargs_of, torch_cls

import funcopt as fo

PER_PARAM = [name for name in ALGORITHMS if issubclass(fo_cls(name), fo.Optimizer)]  # not LBFGS
SOURCES = {"torch.optim": torch_cls, "funcopt": fo_cls}
CASES = [(name, source) for name in PER_PARAM for source in SOURCES]
IDS = [f"{source}.{name}" for name, source in CASES]
NAMES = ("w", "b", "s")


def shapes(name: str) -> list[tuple[int, ...]]:
    if name == "Muon":  # 2-D params only
        return [(4, 3), (5, 2), (3, 3)]
    if INFOS[name].only_supports_sparse_grads:  # SparseAdam: no 0-d param (its gradient is dense)
        return [(4, 3), (5,), (2, 2)]
    return [(4, 3), (5,), ()]


def hyper(name: str) -> dict[str, Any]:
    return kwargs_of(HYPER[name])


def new_params(name: str, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {k: torch.randn(s, generator=g, dtype=dtype).requires_grad_() for k, s in zip(NAMES, shapes(name))}


def gradients(
    name: str, steps: int, dtype: torch.dtype = torch.float32
) -> list[dict[str, torch.Tensor | None]]:
    """Random gradients, sparse ones for SparseAdam; the second step has none for 'b'."""
    g = torch.Generator().manual_seed(1)
    sparse = INFOS[name].only_supports_sparse_grads
    out: list[dict[str, torch.Tensor | None]] = []
    for i in range(steps):
        grads: dict[str, torch.Tensor | None] = {}
        for k, s in zip(NAMES, shapes(name)):
            grad = torch.randn(s, generator=g, dtype=dtype)
            grads[k] = None if (i == 1 and k == "b") else grad.to_sparse() if sparse else grad
        out.append(grads)
    return out


def class_steps(optimizer: torch.optim.Optimizer, params: dict[str, torch.Tensor], grads_seq) -> None:
    for grads in grads_seq:
        for k, p in params.items():
            p.grad = None if grads[k] is None else grads[k].clone()
        optimizer.step()


def functional_steps(tx: fo.GradientTransformation, params: dict, state: Any, grads_seq) -> tuple[dict, Any]:
    for grads in grads_seq:
        updates, state = tx.update(grads, state, params)
        params = fo.apply_updates(params, updates)
    return params, state


def detached(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in params.items()}


def trainable(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().requires_grad_() for k, v in values.items()}


def skip_sparse_functional(name: str) -> None:
    if INFOS[name].only_supports_sparse_grads and not hasattr(fo, "sparse_adam"):
        pytest.skip(f"{name} has no functional factory")


@pytest.mark.parametrize("name,source", CASES, ids=IDS)
def test_class_face_resumes_bit_for_bit(name, source):
    """X -> functional state -> a new X, then steps: as the uninterrupted X."""
    make, kw, grads_seq = SOURCES[source](name), hyper(name), gradients(name, 6)
    straight = new_params(name)
    uninterrupted = make(straight.values(), **kw)
    class_steps(uninterrupted, straight, grads_seq)

    params = new_params(name)
    first = make(params.values(), **kw)
    class_steps(first, params, grads_seq[:3])
    state = fo.functional_state(first, params)
    resumed = trainable(params)
    second = make(resumed.values(), **kw)
    fo.load_functional_state(second, state, resumed)
    assert_same(second.state_dict(), first.state_dict(), rtol=0, atol=0)
    class_steps(second, resumed, grads_seq[3:])
    assert_same(resumed, straight, rtol=0, atol=0)
    assert_same(second.state_dict(), uninterrupted.state_dict(), rtol=0, atol=0)


@pytest.mark.parametrize("name,source", CASES, ids=IDS)
def test_functional_face_continues_within_round_off(name, source):
    """X's state after some steps is the functional state after the same updates; the
    functional update goes on from it, and X again from what that gives."""
    skip_sparse_functional(name)
    make, kw, grads_seq = SOURCES[source](name), hyper(name), gradients(name, 8)
    tx = factory(name)(**kw)
    straight = new_params(name)
    uninterrupted = make(straight.values(), **kw)
    class_steps(uninterrupted, straight, grads_seq[:6])

    params = new_params(name)
    optimizer = make(params.values(), **kw)
    class_steps(optimizer, params, grads_seq[:3])
    state = fo.functional_state(optimizer, params)
    f_params, f_state = functional_steps(
        tx, detached(new_params(name)), tx.init(detached(new_params(name))), grads_seq[:3]
    )
    assert optree.tree_structure(state) == optree.tree_structure(f_state)
    if isinstance(f_state, fo.ScheduledState):  # SGD with dampening: torch keeps no count
        f_state = f_state._replace(count=torch.clamp(f_state.count, max=1))
    assert_same(state, f_state)  # dtypes and devices as init makes them, values to round-off

    f_params, state = functional_steps(tx, detached(params), state, grads_seq[3:6])
    assert_same(f_params, detached(straight))
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(f_params[k])
    fo.load_functional_state(optimizer, state, params)
    class_steps(optimizer, params, grads_seq[6:])
    class_steps(uninterrupted, straight, grads_seq[6:])
    assert_same(params, straight)
    assert_same(optimizer.state_dict(), uninterrupted.state_dict(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name,source", CASES, ids=IDS)
def test_a_new_optimizers_state_is_init(name, source):
    """Before any step (no state, or Adagrad's made at construction) the functional
    state is init's, absent keys as empty nodes, counters as init makes them; and
    loading init's state into a stepped optimizer starts it afresh."""
    skip_sparse_functional(name)
    make, kw = SOURCES[source](name), hyper(name)
    tx = factory(name)(**kw)
    params = new_params(name)
    optimizer = make(params.values(), **kw)
    assert_same(fo.functional_state(optimizer, params), tx.init(detached(params)), rtol=0, atol=0)

    grads_seq = gradients(name, 4)
    fresh_params = new_params(name)
    fresh = make(fresh_params.values(), **kw)
    class_steps(fresh, fresh_params, grads_seq[2:])
    class_steps(optimizer, params, grads_seq[:2])
    fo.load_functional_state(optimizer, tx.init(detached(params)), params)
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(new_params(name)[k])
    class_steps(optimizer, params, grads_seq[2:])
    assert_same(params, fresh_params, rtol=0, atol=0)
    assert_same(optimizer.state_dict(), fresh.state_dict(), rtol=0, atol=0)


def test_absent_keys_are_empty_nodes_both_ways():
    """A key torch has not made is an empty node (Adam's max_exp_avg_sq without amsgrad),
    unless init holds it from the start (SGD's momentum_buffer: init's zeros, which a step
    then reads as torch's first step). With a dampening, which torch's first step skips,
    the functional SGD counts its steps, and torch's SGD does not: a converted count is 0
    before the first step, 1 after, and a count of 0 loads as no buffers."""
    params = new_params("SGD")
    undamped = torch.optim.SGD(params.values(), lr=0.1, momentum=0.9)
    assert_same(
        fo.functional_state(undamped, params),
        fo.sgd(lr=0.1, momentum=0.9).init(detached(params)),
        rtol=0,
        atol=0,
    )
    sgd = torch.optim.SGD(params.values(), lr=0.1, momentum=0.9, dampening=0.5)
    tx = fo.sgd(lr=0.1, momentum=0.9, dampening=0.5)
    assert_same(fo.functional_state(sgd, params), tx.init(detached(params)), rtol=0, atol=0)
    class_steps(sgd, params, gradients("SGD", 1))
    state = fo.functional_state(sgd, params)
    assert int(state.count) == 1
    buffer = state.inner_state.momentum_buffer
    assert_same(buffer["w"], sgd.state[params["w"]]["momentum_buffer"], rtol=0, atol=0)
    fo.load_functional_state(sgd, state._replace(count=torch.zeros_like(state.count)), params)
    assert not sgd.state
    fo.load_functional_state(sgd, state, params)
    assert_same(sgd.state[params["w"]]["momentum_buffer"], buffer["w"], rtol=0, atol=0)

    adam = torch.optim.Adam(params.values())
    class_steps(adam, params, gradients("SGD", 1))
    state = fo.functional_state(adam, params)
    assert state.max_exp_avg_sq == {k: fo.MaskedNode() for k in NAMES}
    assert optree.tree_structure(state) == optree.tree_structure(fo.adam().init(detached(params)))


def test_counters_take_inits_format_and_torchs_back():
    """torch keeps 'step' a float32 on the CPU; init makes it on the param's device, of
    float64 for float64 params. Loaded back, the counters are torch's again."""
    params = new_params("Adam", torch.float64)
    optimizer = torch.optim.Adam(params.values(), lr=0.1)
    class_steps(optimizer, params, gradients("Adam", 2, torch.float64))
    state = fo.functional_state(optimizer, params)
    init = fo.adam(lr=0.1).init(detached(params))
    assert all(s.dtype == i.dtype == torch.float64 for s, i in zip(state.step.values(), init.step.values()))
    assert int(state.step["w"]) == 2 and int(state.step["b"]) == 1  # 'b' had no gradient once
    copies = trainable(params)
    other = torch.optim.Adam(copies.values(), lr=0.1)
    fo.load_functional_state(other, state, copies)
    steps = [other.state[p]["step"] for p in copies.values()]
    assert all(s.dtype == torch.float32 and s.device.type == "cpu" and s.dim() == 0 for s in steps)
    assert_same(other.state_dict(), optimizer.state_dict(), rtol=0, atol=0)


def adamw_chain(lr: float, weight_decay: float) -> fo.GradientTransformation:
    return fo.chain(fo.scale_by_adam(), fo.add_decayed_weights(weight_decay), fo.scale_by_learning_rate(lr))


GENERIC = {
    "chain": (adamw_chain, {"lr": 0.05, "weight_decay": 0.1}),
    "inject_hyperparams": (fo.inject_hyperparams(fo.adamw), {"lr": 0.05}),
    "MultiSteps": (lambda lr: fo.MultiSteps(fo.adam(lr=lr), every_k_schedule=2), {"lr": 0.05}),
    "fo.sgd": (fo.sgd, {"lr": 0.05, "momentum": 0.9}),
    "masked": (
        lambda lr: fo.masked(fo.adam(lr=lr), lambda ps: optree.tree_map(lambda p: p.ndim > 0, ps)),
        {"lr": 0.05},
    ),
}


@pytest.mark.parametrize("case", GENERIC)
def test_any_transformation_both_ways(case):
    """fo.Optimizer(params, factory): its state is the functional one of factory(**hp),
    bit for bit (a chain of building blocks too, which steps in place: chain_inplace.py);
    written into a new optimizer, it resumes as the uninterrupted run."""
    make, hp = GENERIC[case]
    tx, grads_seq = make(**hp), gradients("Adam", 6)
    straight = new_params("Adam")
    uninterrupted = fo.Optimizer(straight.values(), make, **hp)
    class_steps(uninterrupted, straight, grads_seq)

    params = new_params("Adam")
    optimizer = fo.Optimizer(params.values(), make, **hp)
    class_steps(optimizer, params, grads_seq[:3])
    state = fo.functional_state(optimizer, params)
    f_params, f_state = functional_steps(
        tx, detached(new_params("Adam")), tx.init(detached(new_params("Adam"))), grads_seq[:3]
    )
    assert_same(state, f_state, rtol=0, atol=0)
    assert_same(f_params, detached(params), rtol=0, atol=0)

    resumed = trainable(params)
    again = fo.Optimizer(resumed.values(), make, **hp)
    fo.load_functional_state(again, state, resumed)
    class_steps(again, resumed, grads_seq[3:])
    assert_same(resumed, straight, rtol=0, atol=0)
    assert_same(again.state_dict(), uninterrupted.state_dict(), rtol=0, atol=0)


def test_params_match_by_identity_or_by_order():
    params = new_params("Adam")
    optimizer = fo.Adam(params.values(), lr=0.1)
    class_steps(optimizer, params, gradients("Adam", 2))
    by_order = fo.functional_state(optimizer, [p.detach() for p in params.values()])  # copies: by order
    assert_same(by_order.exp_avg, [optimizer.state[p]["exp_avg"] for p in params.values()], rtol=0, atol=0)
    subset = fo.functional_state(optimizer, {"b": params["b"]})  # by identity: some params
    assert list(subset.exp_avg) == ["b"]
    state = subset._replace(exp_avg={"b": torch.ones(5)})
    fo.load_functional_state(optimizer, state, {"b": params["b"]})
    assert torch.equal(optimizer.state[params["b"]]["exp_avg"], torch.ones(5))
    assert not torch.equal(optimizer.state[params["w"]]["exp_avg"], torch.ones(4, 3))


def test_the_functional_state_shares_no_tensor_with_the_optimizer():
    params = new_params("Adam")
    optimizer = torch.optim.Adam(params.values(), lr=0.1)
    class_steps(optimizer, params, gradients("Adam", 1))
    state = fo.functional_state(optimizer, params)
    before = optree.tree_map(torch.clone, state)
    class_steps(optimizer, params, gradients("Adam", 1))
    assert_same(state, before, rtol=0, atol=0)
    exp_avg = optimizer.state[params["w"]]["exp_avg"]
    fo.load_functional_state(optimizer, state, params)
    assert optimizer.state[params["w"]]["exp_avg"] is exp_avg  # written in place
    state.exp_avg["w"].zero_()
    assert not torch.equal(exp_avg, state.exp_avg["w"])


def test_param_groups_and_their_counts():
    """An algorithm's state holds a counter per param, so groups may differ; a
    transformation's count is kept once for all params, so groups that stepped apart
    cannot share one functional state."""
    params = new_params("Adam")
    groups = [{"params": [params["w"]], "lr": 0.5}, {"params": [params["b"], params["s"]]}]
    optimizer = torch.optim.Adam(groups, lr=0.1)
    grads = gradients("Adam", 3)
    grads[2]["w"] = None
    class_steps(optimizer, params, grads)
    state = fo.functional_state(optimizer, params)
    assert [int(s) for s in state.step.values()] == [2, 2, 3]

    generic = fo.Optimizer([{"params": [params["w"]]}, {"params": [params["b"], params["s"]]}], adamw_chain, lr=0.1, weight_decay=0.0)  # fmt: skip
    for p in params.values():
        p.grad = torch.ones_like(p)
    generic.step()
    assert int(fo.functional_state(generic, params)[0].count) == 1
    params["w"].grad = None
    generic.step()
    with pytest.raises(ValueError, match="differs between the param groups"):
        fo.functional_state(generic, params)
    assert int(fo.functional_state(generic, {"b": params["b"]})[0].count) == 2


def test_errors_say_what_to_pass():
    params = new_params("Adam")
    optimizer = torch.optim.Adam(params.values(), lr=0.1)
    class_steps(optimizer, params, gradients("Adam", 1))
    saved = optimizer.state_dict()
    with pytest.raises(ValueError, match="as many tensors as it has"):
        fo.functional_state(optimizer, [torch.zeros(4, 3)])
    with pytest.raises(TypeError, match="dict\\(model.named_parameters\\(\\)\\)"):
        fo.functional_state(optimizer, torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="does not have the structure"):
        fo.load_functional_state(optimizer, fo.nadam().init(detached(params)), params)
    bad = fo.functional_state(optimizer, params)
    bad = bad._replace(exp_avg_sq={**bad.exp_avg_sq, "s": torch.zeros(2)})
    bad = bad._replace(exp_avg={**bad.exp_avg, "w": torch.ones(4, 3)})
    with pytest.raises(ValueError, match="has shape \\(2,\\), where \\(\\) belongs"):
        fo.load_functional_state(optimizer, bad, params)
    assert_same(optimizer.state_dict(), saved, rtol=0, atol=0)  # nothing written
    lbfgs = torch.optim.LBFGS(params.values())
    with pytest.raises(TypeError, match="keep a state per param"):
        fo.functional_state(lbfgs, params)
