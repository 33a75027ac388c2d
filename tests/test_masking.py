"""`fo.masked` and `fo.partition`: transformations for part of the params, the
functional form of torch.optim's param groups."""

from __future__ import annotations

import io

import optree
import pytest
import torch
from helpers import (
    ALGORITHMS,
    assert_same,
    compiled_and_eager_steps,
    factory,
    run,
    skip_unless_steps_on_gradients,
    skip_unsupported,
    torch_cls,
    weight_decay,
)
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
            {"params": [t for t in tensors if t.ndim > 1], "lr": 0.05, **weight_decay(name, 0.1)},
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
    """A learning rate and weight decay (where the algorithm has one) of their own for
    the weights, as two torch param groups."""
    skip_unless_steps_on_gradients(name)
    skip_unsupported(name, vectors=True)  # the biases' group
    params = model_params()
    grads_seq = gradient_sequence(params)
    tx = fo.partition(
        {"decay": factory(name)(lr=0.05, **weight_decay(name, 0.1)), "no_decay": factory(name)()}, by_rank
    )
    new, _ = run(tx, params, grads_seq)
    assert_same(new, torch_groups(name, params, grads_seq), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_chain_of_complementary_masks_equals_partition(name):
    skip_unless_steps_on_gradients(name)
    skip_unsupported(name, vectors=True)  # the biases' group
    params = model_params()
    grads_seq = gradient_sequence(params)
    chained = fo.chain(
        fo.masked(factory(name)(**weight_decay(name, 0.1)), is_weight),
        fo.masked(factory(name)(), lambda tree: optree.tree_map(lambda w: not w, is_weight(tree))),
    )
    decay = factory(name)(**weight_decay(name, 0.1))
    parted = fo.partition({"decay": decay, "no_decay": factory(name)()}, by_rank)
    assert_same(run(chained, params, grads_seq)[0], run(parted, params, grads_seq)[0], rtol=0, atol=0)


def test_masked_passes_other_updates_through_and_keeps_no_state_for_them():
    params = model_params()
    grads = gradient_sequence(params, steps=2)
    tx = fo.masked(fo.adamax(lr=0.1), is_weight)
    state = tx.init(params)
    assert isinstance(state, fo.MaskedState)
    assert isinstance(state.inner.exp_avg["layer1"]["bias"], fo.MaskedNode)  # no state, and no None leaf
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


def scaling(factor):
    """A stateless transformation that multiplies the updates: which leaves it changed
    shows which leaves a mask or labels selected."""
    return fo.GradientTransformation(
        lambda params: fo.EmptyState(),
        lambda updates, state, params=None: (optree.tree_map(lambda u: u * factor, updates), state),
    )


def recorder(calls):
    """A stateless transformation that records the extra arguments of each update."""

    def update(updates, state, params=None, **extra_args):
        calls.append(extra_args)
        return updates, state

    return fo.GradientTransformation(lambda params: fo.EmptyState(), update)


def weights_of(tree):
    return {k: v["weight"] for k, v in tree.items()}


def test_masked_and_partition_states_cross_vmap():
    """No None in a masked state: vmap(init) and a vmapped update over a batch of params
    and grads (the members' own steps), where None leaves failed to come out of vmap."""
    batch = {"w": torch.randn(3, 2, 2), "b": torch.randn(3, 2)}
    grads = {"w": torch.randn(3, 2, 2), "b": torch.randn(3, 2)}
    for tx in (
        fo.masked(fo.nadam(weight_decay=0.1), {"w": True, "b": False}),
        fo.partition({0: fo.nadam(), 1: fo.adamax()}, {"w": 0, "b": 1}),
    ):
        state = vmap(tx.init)(batch)
        assert all(isinstance(t, torch.Tensor) for t in optree.tree_leaves(state, none_is_leaf=True))
        updates, new_state = vmap(tx.update)(grads, state, batch)
        for i in range(3):
            one = optree.tree_map(lambda t, i=i: t[i], (grads, batch))
            expected, expected_state = tx.update(one[0], tx.init(one[1]), one[1])
            assert_same(optree.tree_map(lambda t, i=i: t[i], updates), expected, rtol=1e-6, atol=1e-7)
            assert_same(optree.tree_map(lambda t, i=i: t[i], new_state), expected_state, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "mask",
    [
        {"layer1": {"weight": True, "bias": True}, "layer2": {"weight": False, "bias": False}},
        {"layer1": True, "layer2": False},
        lambda tree: {"layer1": True, "layer2": False},
    ],
    ids=["tree", "prefix", "function-of-a-prefix"],
)
def test_mask_as_a_prefix_of_the_params(mask):
    """A bool for a whole subtree, as optax takes it: NAdam on layer1 alone, layer2's
    updates passed through, and no state kept for layer2."""
    params = model_params()
    grads_seq = gradient_sequence(params)
    tx = fo.masked(fo.nadam(lr=0.05, weight_decay=0.1), mask)
    state = tx.init(params)
    alone = fo.nadam(lr=0.05, weight_decay=0.1)
    alone_state = alone.init(params["layer1"])
    for grads in grads_seq:
        updates, state = tx.update(grads, state, params)
        expected, alone_state = alone.update(grads["layer1"], alone_state, params["layer1"])
        assert_same(updates["layer1"], expected, rtol=0, atol=0)
        assert_same(updates["layer2"], grads["layer2"], rtol=0, atol=0)
    assert_same([field["layer1"] for field in state.inner], list(alone_state), rtol=0, atol=0)
    assert not optree.tree_leaves([field["layer2"] for field in state.inner])  # MaskedNode: no state


@pytest.mark.parametrize(
    "labels",
    [{"layer1": 0, "layer2": 1}, lambda tree: {"layer1": 0, "layer2": 1}],
    ids=["prefix", "function-of-a-prefix"],
)
def test_partition_with_prefix_labels_that_are_not_strings(labels):
    """Labels for whole subtrees, any keys of `transforms` (ints here): each part steps as
    its transformation alone on it."""
    params = model_params()
    grads_seq = gradient_sequence(params)
    tx = fo.partition({0: fo.nadam(lr=0.05), 1: fo.adamax(lr=0.1, weight_decay=0.1)}, labels)
    new, state = run(tx, params, grads_seq)
    assert sorted(state) == [0, 1]
    assert_same(new["layer1"], run(fo.nadam(lr=0.05), params["layer1"], [g["layer1"] for g in grads_seq])[0])
    expected = run(fo.adamax(lr=0.1, weight_decay=0.1), params["layer2"], [g["layer2"] for g in grads_seq])[0]
    assert_same(new["layer2"], expected, rtol=0, atol=0)


def test_empty_params():
    """Params with no leaves (a model part with no params) make no error, as in optax."""
    tx = fo.partition({0: fo.adagrad()}, lambda _: 0)
    state = tx.init([])
    assert tx.update([], state, []) == ([], state)
    tx = fo.masked(fo.adagrad(), lambda _: True)
    assert tx.update({}, tx.init({}), {})[0] == {}


@pytest.mark.parametrize(
    "make",
    [
        lambda optax, scale: (
            optax.masked(scale(2.0), {"layer1": True, "layer2": False}),
            fo.masked(scaling(2.0), {"layer1": True, "layer2": False}),
        ),
        lambda optax, scale: (
            optax.masked(scale(2.0), lambda t: {"layer1": {"weight": False, "bias": True}, "layer2": True}),
            fo.masked(scaling(2.0), lambda t: {"layer1": {"weight": False, "bias": True}, "layer2": True}),
        ),
        lambda optax, scale: (optax.masked(scale(2.0), False), fo.masked(scaling(2.0), False)),
        lambda optax, scale: (
            optax.partition({0: scale(2.0), 1: scale(3.0)}, {"layer1": 0, "layer2": 1}),
            fo.partition({0: scaling(2.0), 1: scaling(3.0)}, {"layer1": 0, "layer2": 1}),
        ),
        lambda optax, scale: (
            optax.partition(
                {"a": scale(2.0), "b": scale(3.0), "c": scale(5.0)},
                lambda t: {"layer1": {"weight": "a", "bias": "c"}, "layer2": "b"},
            ),
            fo.partition(
                {"a": scaling(2.0), "b": scaling(3.0), "c": scaling(5.0)},
                lambda t: {"layer1": {"weight": "a", "bias": "c"}, "layer2": "b"},
            ),
        ),
    ],
    ids=["masked-prefix", "masked-function-mixed", "masked-bool", "partition-prefix", "partition-mixed"],
)
def test_masks_and_labels_select_as_in_optax(make):
    """optax (the oracle) and funcopt select the same leaves for the same mask or labels."""
    optax = pytest.importorskip("optax")
    jnp = pytest.importorskip("jax.numpy")
    np = pytest.importorskip("numpy")
    params = model_params()
    grads = gradient_sequence(params, steps=1)[0]
    theirs, ours = make(optax, optax.scale)
    as_jax = optree.tree_map(lambda t: jnp.asarray(t.numpy()), (grads, params))
    expected, _ = theirs.update(as_jax[0], theirs.init(as_jax[1]), as_jax[1])
    updates, _ = ours.update(grads, ours.init(params), params)
    expected = optree.tree_map(lambda a: torch.from_numpy(np.array(a)), expected)
    assert_same(updates, expected, rtol=1e-6, atol=0)


def test_extra_args_pass_to_the_inner_transformations():
    """``update(grads, state, params, **extra_args)`` passes them on (to every part of a
    partition); an inner update that takes none still serves when none are given."""
    params = model_params()
    calls = []
    for tx in (
        fo.masked(recorder(calls), is_weight),
        fo.partition({"decay": recorder(calls), "no_decay": recorder(calls)}, by_rank),
    ):
        tx.update(params, tx.init(params), params, loss=torch.tensor(1.0), tag="x")
    assert len(calls) == 3 and all(sorted(c) == ["loss", "tag"] for c in calls)
    fo.masked(fo.nadam(), is_weight).update(params, fo.masked(fo.nadam(), is_weight).init(params), params)


def test_a_mask_deeper_than_the_params_or_not_of_bools():
    params = {"w": torch.ones(2), "b": torch.ones(2)}
    with pytest.raises(ValueError, match="masked init: the mask does not have the structure of the params"):
        fo.masked(fo.adamax(), {"w": {"x": True}, "b": True}).init(params)
    with pytest.raises(TypeError, match="masked update: the mask holds an int where a bool belongs"):
        fo.masked(fo.adamax(), lambda t: {"w": 1, "b": True}).update(params, fo.EmptyState(), params)
    with pytest.raises(ValueError, match=r"partition: labels \[None\] name no transformation"):
        fo.partition({0: fo.adamax()}, {"w": 0, "b": None}).init(params)


def test_adapter_state_dict_round_trip_with_masks():
    """fo.Optimizer keeps a masked state per param (None for a param outside a mask, as in
    checkpoints saved before MaskedNode): state_dict, torch.save and torch.load
    (weights_only) and load_state_dict into a new optimizer continue the run exactly."""
    params = model_params()
    grads_seq = gradient_sequence(params, steps=4)

    def make(lr):
        return fo.chain(
            fo.masked(fo.nadam(lr=lr, weight_decay=0.1), is_weight),
            fo.masked(fo.adamax(lr=lr), lambda t: optree.tree_map(lambda w: not w, is_weight(t))),
        )

    def steps(opt, tensors, grads_seq):
        for grads in grads_seq:
            for t, g in zip(tensors, optree.tree_leaves(grads)):
                t.grad = g.clone()
            opt.step()

    straight = [p.clone().requires_grad_() for p in optree.tree_leaves(params)]
    steps(fo.Optimizer(straight, make, lr=0.01), straight, grads_seq)
    resumed = [p.clone().requires_grad_() for p in optree.tree_leaves(params)]
    opt = fo.Optimizer(resumed, make, lr=0.01)
    steps(opt, resumed, grads_seq[:2])
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    opt = fo.Optimizer(resumed, make, lr=0.01)
    opt.load_state_dict(torch.load(buffer))
    steps(opt, resumed, grads_seq[2:])
    assert_same(resumed, straight, rtol=0, atol=0)


def test_adapter_with_a_mask_for_all_params():
    """A mask that is one bool (a prefix of any params) in fo.Optimizer: Adamax on every
    param, NAdam on none, as torch's Adamax."""
    params = model_params()
    grads_seq = gradient_sequence(params)
    tensors = [p.clone().requires_grad_() for p in optree.tree_leaves(params)]
    opt = fo.Optimizer(
        tensors, lambda lr: fo.chain(fo.masked(fo.adamax(lr=lr), True), fo.masked(fo.nadam(), False)), lr=0.01
    )
    expected = [p.clone().requires_grad_() for p in optree.tree_leaves(params)]
    reference = torch.optim.Adamax(expected, lr=0.01)
    for grads in grads_seq:
        for t, e, g in zip(tensors, expected, optree.tree_leaves(grads)):
            t.grad, e.grad = g.clone(), g.clone()
        opt.step()
        reference.step()
    assert_same(tensors, expected, rtol=1e-6, atol=1e-7)
