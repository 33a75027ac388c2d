"""`fo.masked` and `fo.partition`: transformations for part of the params, the
functional form of torch.optim's param groups."""

from __future__ import annotations

import io

import optree
import pytest
import torch
from helpers import ALGORITHMS, assert_same, compiled_and_eager_steps, factory, run, torch_cls
from torch.func import vmap

import funcopt as fo


def model_params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "layer1": {"weight": torch.randn(4, 3, generator=g), "bias": torch.randn(4, generator=g)},
        "layer2": {"weight": torch.randn(2, 4, generator=g), "bias": torch.randn(2, generator=g)},
    }


def gradient_sequence(params, steps=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [optree.tree_map(lambda p: torch.randn(p.shape, generator=g), params) for _ in range(steps)]


def by_rank(tree):
    """Weights get weight decay; biases do not."""
    return optree.tree_map(lambda p: "decay" if p.ndim > 1 else "no_decay", tree)


def is_weight(tree):
    return optree.tree_map(lambda p: p.ndim > 1, tree)


def torch_groups(name, params, grads_seq):
    """torch.optim with one group for the weights (their own lr, weight decay) and one
    for the biases (the defaults)."""
    values, treedef = optree.tree_flatten(params)
    tensors = [v.clone().requires_grad_() for v in values]
    opt = torch_cls(name)(
        [
            {"params": [t for t in tensors if t.ndim > 1], "lr": 0.05, "weight_decay": 0.1},
            {"params": [t for t in tensors if t.ndim <= 1]},
        ]
    )
    for grads in grads_seq:
        for t, g in zip(tensors, optree.tree_leaves(grads)):
            t.grad = g.clone()
        opt.step()
    return treedef.unflatten([t.detach() for t in tensors])


@pytest.mark.parametrize("name", ALGORITHMS)
def test_partition_equals_torch_param_groups(name):
    """A learning rate and weight decay of their own for the weights, as two torch param
    groups."""
    params = model_params()
    grads_seq = gradient_sequence(params)
    tx = fo.partition(
        {"decay": factory(name)(lr=0.05, weight_decay=0.1), "no_decay": factory(name)()}, by_rank
    )
    new, _ = run(tx, params, grads_seq)
    assert_same(new, torch_groups(name, params, grads_seq), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_chain_of_complementary_masks_equals_partition(name):
    params = model_params()
    grads_seq = gradient_sequence(params)
    chained = fo.chain(
        fo.masked(factory(name)(weight_decay=0.1), is_weight),
        fo.masked(factory(name)(), lambda tree: optree.tree_map(lambda w: not w, is_weight(tree))),
    )
    parted = fo.partition({"decay": factory(name)(weight_decay=0.1), "no_decay": factory(name)()}, by_rank)
    assert_same(run(chained, params, grads_seq)[0], run(parted, params, grads_seq)[0], rtol=0, atol=0)


def test_masked_passes_other_updates_through_and_keeps_no_state_for_them():
    params = model_params()
    grads = gradient_sequence(params, steps=2)
    tx = fo.masked(fo.adamax(lr=0.1), is_weight)
    state = tx.init(params)
    assert isinstance(state, fo.MaskedState)
    assert state.inner.exp_avg["layer1"]["bias"] is None
    assert state.inner.exp_avg["layer1"]["weight"].shape == (4, 3)
    for g in grads:
        updates, state = tx.update(g, state, params)
        assert updates["layer2"]["bias"] is g["layer2"]["bias"]  # passed through as it is
        assert not torch.equal(updates["layer2"]["weight"], g["layer2"]["weight"])
    assert int(state.inner.step["layer1"]["weight"]) == 2
    # the same as the inner transformation on the masked leaves alone
    alone = fo.adamax(lr=0.1)
    weights = {k: v["weight"] for k, v in params.items()}
    s = alone.init(weights)
    for g in grads:
        expected, s = alone.update({k: v["weight"] for k, v in g.items()}, s, weights)
    for k in params:
        torch.testing.assert_close(updates[k]["weight"], expected[k], rtol=0, atol=0)


def test_a_none_gradient_skips_its_leaf():
    """As torch skips a param without .grad: its update is None and its state stays. A
    mask function sees the params, never a None gradient."""
    params = model_params()
    grads = gradient_sequence(params, steps=2)
    tx = fo.partition({"decay": fo.nadam(weight_decay=0.1), "no_decay": fo.nadam()}, by_rank)
    _, state = tx.update(grads[0], tx.init(params), params)
    grads[1]["layer1"]["weight"] = None
    updates, new_state = tx.update(grads[1], state, params)
    assert updates["layer1"]["weight"] is None
    assert (
        new_state["decay"].inner.exp_avg["layer1"]["weight"]
        is state["decay"].inner.exp_avg["layer1"]["weight"]
    )
    assert int(new_state["decay"].inner.step["layer2"]["weight"]) == 2


def test_mask_as_a_tree_equals_mask_as_a_function():
    params = model_params()
    grads_seq = gradient_sequence(params)
    as_tree = fo.masked(fo.nadam(weight_decay=0.1), is_weight(params))
    as_function = fo.masked(fo.nadam(weight_decay=0.1), is_weight)
    assert_same(run(as_tree, params, grads_seq)[0], run(as_function, params, grads_seq)[0], rtol=0, atol=0)


def test_update_without_params():
    params = model_params()
    grads = gradient_sequence(params, steps=1)[0]
    tx = fo.partition({"decay": fo.adagrad(lr=0.1), "no_decay": fo.adadelta()}, by_rank(params))
    updates, _ = tx.update(grads, tx.init(params))
    with_params, _ = tx.update(grads, tx.init(params), params)
    assert_same(updates, with_params, rtol=0, atol=0)


def test_vmap_over_the_learning_rate_of_one_part():
    """A sweep over the weights' learning rate, the biases' fixed: equals the loop."""
    params = model_params()
    grads_seq = gradient_sequence(params)

    def final(lr):
        tx = fo.partition(
            {"decay": fo.nadam(lr=lr, weight_decay=0.1), "no_decay": fo.nadam(lr=0.01)}, by_rank
        )
        return run(tx, params, grads_seq)[0]

    lrs = torch.tensor([0.001, 0.01, 0.1])
    batched = vmap(final)(lrs)
    for i, lr in enumerate(lrs):
        assert_same(optree.tree_map(lambda t, i=i: t[i], batched), final(lr), rtol=1e-6, atol=1e-7)


def test_hypergradients_of_per_part_learning_rates():
    """A learning rate per part, learned by gradient (as MAML++ learns one per layer):
    the gradient through inner steps matches central differences (float64)."""
    g = torch.Generator().manual_seed(0)
    params = {
        "w": torch.randn(4, 3, generator=g, dtype=torch.float64),
        "b": torch.randn(3, generator=g, dtype=torch.float64),
    }
    x, y = (
        torch.randn(16, 4, generator=g, dtype=torch.float64),
        torch.randn(16, 3, generator=g, dtype=torch.float64),
    )

    def loss_fn(p, x, y):
        return (torch.tanh(x @ p["w"] + p["b"]) - y).pow(2).mean()

    def final_loss(lrs):
        tx = fo.partition({"w": fo.adamax(lr=lrs[0]), "b": fo.nadam(lr=lrs[1])}, {"w": "w", "b": "b"})
        adapted, _, _ = fo.inner_loop(loss_fn, params, tx, [(x, y)] * 3)
        return loss_fn(adapted, x, y)

    lrs = torch.tensor([0.05, 0.1], dtype=torch.float64)
    expected = torch.stack(
        [
            (final_loss(lrs + 1e-6 * e) - final_loss(lrs - 1e-6 * e)) / 2e-6
            for e in torch.eye(2, dtype=torch.float64)
        ]
    )
    torch.testing.assert_close(torch.func.grad(final_loss)(lrs), expected, rtol=1e-6, atol=1e-9)


def test_compile_fullgraph_without_recompiles():
    params = model_params()
    tx = fo.partition({"decay": fo.adamax(weight_decay=0.1), "no_decay": fo.adamax()}, by_rank)
    (comp_p, _), (eager_p, _) = compiled_and_eager_steps(tx, params, gradient_sequence(params))
    assert_same(comp_p, eager_p, rtol=1e-6, atol=1e-7)


def test_state_saves_and_loads_with_weights_only():
    params = model_params()
    tx = fo.partition({"decay": fo.nadam(weight_decay=0.1), "no_decay": fo.nadam()}, by_rank)
    _, state = run(tx, params, gradient_sequence(params, steps=2))
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)  # weights_only=True by default
    assert optree.tree_structure(loaded, none_is_leaf=True) == optree.tree_structure(state, none_is_leaf=True)
    assert_same(optree.tree_leaves(loaded), optree.tree_leaves(state), rtol=0, atol=0)


def test_adapter_with_a_mask_on_each_param():
    """fo.Optimizer gives its transformation a dict of a group's params (of one param when
    it makes that param's state): a mask that maps over the tree it gets serves. An lr
    and weight decay of their own for the weights, as torch's param groups."""
    params = model_params()
    grads_seq = gradient_sequence(params)
    tensors = [p.clone().requires_grad_() for p in optree.tree_leaves(params)]
    opt = fo.Optimizer(
        tensors,
        lambda lr: fo.chain(
            fo.masked(fo.adamax(lr=0.05, weight_decay=0.1), is_weight),
            fo.masked(fo.adamax(lr=lr), lambda tree: optree.tree_map(lambda p: p.ndim <= 1, tree)),
        ),
        lr=0.002,
    )
    for grads in grads_seq:
        for t, g in zip(tensors, optree.tree_leaves(grads)):
            t.grad = g.clone()
        opt.step()
    expected = torch_groups("Adamax", params, grads_seq)
    for t, e in zip(tensors, optree.tree_leaves(expected)):
        torch.testing.assert_close(t.detach(), e, rtol=1e-6, atol=1e-7)


def test_bad_masks_and_labels():
    params = model_params()
    with pytest.raises(ValueError, match="masked init: the mask does not have the structure of the params"):
        fo.masked(fo.adamax(), {"layer1": True}).init(params)
    with pytest.raises(TypeError, match="masked init: the mask holds a Tensor where a bool belongs"):
        fo.masked(fo.adamax(), lambda tree: optree.tree_map(lambda p: p > 0, tree)).init(params)
    with pytest.raises(
        ValueError,
        match=r"partition: labels \['decy'\] name no transformation; the transformations are \['decay'\]",
    ):
        fo.partition({"decay": fo.adamax()}, lambda tree: optree.tree_map(lambda p: "decy", tree)).init(
            params
        )
    tx = fo.partition({"decay": fo.adamax(), "no_decay": fo.adamax()}, by_rank)
    with pytest.raises(
        ValueError,
        match=r"partition update got a state of type AdamaxState; .* keys \['decay', 'no_decay'\]\)$",
    ):
        tx.update(params, fo.adamax().init(params), params)
    with pytest.raises(ValueError, match=r"partition update got a state of keys \['decay'\]"):
        tx.update(params, {"decay": tx.init(params)["decay"]}, params)
    with pytest.raises(TypeError, match="masked update got a state of type AdamaxState"):
        fo.masked(fo.adamax(), is_weight).update(params, fo.adamax().init(params), params)
