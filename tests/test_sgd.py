"""What is particular to SGD: torch creates its momentum_buffer only with momentum, and
only at the first step, as a copy of the gradient (dampening starts at the second)."""

from __future__ import annotations

import optree
import pytest
import torch
from torch.func import vmap

import funcopt as fo


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_momentum_buffer_appears_as_torch_creates_it(momentum):
    torch.manual_seed(0)
    w0 = torch.randn(4)
    ours, theirs = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    opt = fo.SGD([ours], lr=0.1, momentum=momentum, dampening=0.5)
    reference = torch.optim.SGD([theirs], lr=0.1, momentum=momentum, dampening=0.5)
    assert opt.state_dict()["state"] == reference.state_dict()["state"] == {}
    for _ in range(3):
        g = torch.randn(4)
        ours.grad, theirs.grad = g.clone(), g.clone()
        opt.step()
        reference.step()
        ours_state, theirs_state = opt.state_dict()["state"], reference.state_dict()["state"]
        assert ours_state.keys() == theirs_state.keys()
        for key in theirs_state:
            assert ours_state[key].keys() == theirs_state[key].keys()
            for name, value in theirs_state[key].items():
                assert torch.equal(ours_state[key][name], value)
    assert torch.equal(ours.data, theirs.data)


def test_functional_state_keeps_its_structure_with_dampening():
    """The buffer is there from init, as zeros; the state counts the steps, so that the
    first update skips the dampening and copies the gradient, as torch's first step."""
    params = {"w": torch.ones(3), "b": torch.zeros(2)}
    grads = {"w": torch.tensor([1.0, 2.0, 3.0]), "b": torch.tensor([-1.0, 1.0])}
    tx = fo.sgd(lr=0.1, momentum=0.9, dampening=0.5)
    state = tx.init(params)
    structure = optree.tree_structure(state)
    assert torch.equal(state.inner_state.momentum_buffer["w"], torch.zeros(3))
    _, state = tx.update(grads, state, params)
    assert torch.equal(state.inner_state.momentum_buffer["w"], grads["w"])  # a copy, no dampening
    _, state = tx.update(grads, state, params)
    torch.testing.assert_close(state.inner_state.momentum_buffer["w"], grads["w"] * 0.9 + grads["w"] * 0.5)
    assert optree.tree_structure(state) == structure
    assert not fo.sgd(lr=0.1).init(params).momentum_buffer["w"]  # no momentum: stays empty


@pytest.mark.parametrize("dampening", [0.3, "tensor", "schedule"])
def test_dampening_as_torch_under_vmap_and_compile(dampening):
    """A dampening given as a number, a tensor or a schedule: torch's steps, also where
    the count is a tensor (vmap over the gradients, as the state's count is traced)."""
    value = {"tensor": torch.tensor(0.3, dtype=torch.float64), "schedule": lambda count: 0.3}.get(
        dampening, dampening
    )
    p0 = torch.randn(4, dtype=torch.float64)
    grads = torch.randn(3, 4, dtype=torch.float64)
    ref = p0.clone().requires_grad_()
    opt = torch.optim.SGD([ref], lr=0.1, momentum=0.9, dampening=0.3)
    for g in grads:
        ref.grad = g.clone()
        opt.step()
    tx = fo.sgd(lr=0.1, momentum=0.9, dampening=value)

    def run(p, gs):
        state = tx.init([p])
        for g in gs:
            updates, state = tx.update([g], state, [p])
            p = p + updates[0]
        return p

    torch.testing.assert_close(run(p0, grads), ref.detach(), rtol=1e-14, atol=0)
    batched = torch.func.vmap(run, in_dims=(None, 0))(p0, torch.stack([grads, grads]))
    torch.testing.assert_close(batched[1], ref.detach(), rtol=1e-14, atol=0)


def test_vmap_over_momentum_matches_a_loop():
    torch.manual_seed(0)
    params = [torch.randn(5)]
    grads_seq = [[torch.randn(5)] for _ in range(3)]

    def run(momentum):
        tx = fo.sgd(lr=0.1, momentum=momentum, nesterov=True)
        ps, state = params, tx.init(params)
        for grads in grads_seq:
            updates, state = tx.update(grads, state, ps)
            ps = fo.apply_updates(ps, updates)
        return ps[0]

    momenta = torch.tensor([0.1, 0.5, 0.9])
    torch.testing.assert_close(vmap(run)(momenta), torch.stack([run(m) for m in momenta]))


def test_nesterov_needs_momentum_and_no_dampening():
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero dampening"):
        fo.sgd(nesterov=True)
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero dampening"):
        fo.SGD([torch.nn.Parameter(torch.ones(1))], momentum=0.9, dampening=0.1, nesterov=True)
