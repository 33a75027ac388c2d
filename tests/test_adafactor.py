"""What is particular to Adafactor: factored second moments for params of two or more
dimensions (``row_var`` and ``col_var``, not shaped like the param) and a full
``variance`` for the others, a step size that scales with each param's RMS (read in
Python by torch's step), epsilon1 None meaning the dtype's machine epsilon, and no
complex params. Everything is compared with ``torch.optim.Adafactor``."""

from __future__ import annotations

import optree
import pytest
import torch
from helpers import assert_same, optim_inputs
from torch.func import grad, vmap

import funcopt as fo

SHAPES = [(6, 4), (3, 5, 2), (7,), ()]  # factored: a matrix and a 3-d param; full: a vector, a 0-d param


def rand(shapes, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float32).mul(scale).to(dtype) for s in shapes]


def three_ways(kwargs, base, grad_steps):
    """torch.optim.Adafactor, fo.Adafactor and fo.adafactor stepped side by side from
    `base`; yields after every step the three lists of params and the two optimizers
    and the functional state."""
    ref_params = [p.clone().requires_grad_() for p in base]
    our_params = [p.clone().requires_grad_() for p in base]
    ref = torch.optim.Adafactor(ref_params, **kwargs)
    ours = fo.Adafactor(our_params, **kwargs)
    tx = fo.adafactor(**{k: v for k, v in kwargs.items() if k != "foreach"})
    f_params, f_state = list(base), tx.init(list(base))
    for grads in grad_steps:
        for ps in (ref_params, our_params):
            for p, g in zip(ps, grads):
                p.grad = None if g is None else g.clone()
        ref.step()
        ours.step()
        updates, f_state = tx.update(grads, f_state, f_params)
        f_params = fo.apply_updates(f_params, updates)
        yield ref_params, our_params, f_params, ref, ours, f_state


def test_state_keys_and_shapes_as_torch_creates_them():
    base = rand(SHAPES)
    grads = [rand(SHAPES, seed=1)]
    for ref_params, _, _, ref, ours, f_state in three_ways({}, base, grads):
        sd = ref.state_dict()["state"]
        assert [list(s) for s in sd.values()] == [
            ["step", "row_var", "col_var"],
            ["step", "row_var", "col_var"],
            ["step", "variance"],
            ["step", "variance"],
        ]
        assert [tuple(s["row_var"].shape) for s in list(sd.values())[:2]] == [(6, 1), (3, 5, 1)]
        assert [tuple(s["col_var"].shape) for s in list(sd.values())[:2]] == [(1, 4), (3, 1, 2)]
        assert_same(ours.state_dict(), ref.state_dict(), rtol=0, atol=0)
        # the functional state holds an empty node where torch has no key
        assert f_state.variance[0] == fo.MaskedNode() and f_state.row_var[2] == fo.MaskedNode()
        for i, p in enumerate(ref_params):
            for key, value in ref.state[p].items():
                assert_same(getattr(f_state, key)[i], value)


CASES = optim_inputs("Adafactor")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("desc,kwargs", CASES, ids=[d for d, _ in CASES])
def test_matches_torch_on_factored_and_full_params(desc, kwargs, dtype):
    """torch's option table, params of 2 and 3 dimensions, vectors and 0-d ones, some
    steps without a gradient: the class bit for bit with torch's default (for-loop)
    step, params and state, and to round-off with its foreach step (which rounds the
    update apart); the functional update to round-off (one rounding more where it adds
    its update)."""
    base = rand(SHAPES, dtype)
    gen = torch.Generator().manual_seed(1)
    steps = [
        [
            None if (k == 2 and i % 2) else torch.randn(s, generator=gen).to(dtype)
            for i, s in enumerate(SHAPES)
        ]
        for k in range(6)
    ]
    tol = {"rtol": 0.02, "atol": 0.02} if dtype == torch.bfloat16 else {}
    adapter_tol = tol if kwargs.get("foreach") else {"rtol": 0, "atol": 0}
    for ref_params, our_params, f_params, ref, ours, _ in three_ways(kwargs, base, steps):
        assert_same(our_params, ref_params, **adapter_tol)
        assert_same(ours.state_dict(), ref.state_dict(), **adapter_tol)
        assert_same(f_params, ref_params, **tol)


@pytest.mark.parametrize("lr_dtype", [torch.float32, torch.float64], ids=str)
def test_tensor_lr_bit_for_bit(lr_dtype):
    """A tensor lr: torch's step size ``max(eps2, RMS) * min(lr, 1/sqrt(t))`` is then a
    tensor while lr is the smaller, rounding in lr's dtype, and a float once
    ``1/sqrt(t)`` is (here from the third step on)."""
    base = rand(SHAPES)
    grads = [rand(SHAPES, seed=k + 1) for k in range(6)]
    kwargs = {"lr": torch.tensor(0.6, dtype=lr_dtype), "weight_decay": 0.3}
    for ref_params, our_params, f_params, ref, ours, _ in three_ways(kwargs, base, grads):
        assert_same(our_params, ref_params, rtol=0, atol=0)
        assert_same(ours.state_dict(), ref.state_dict(), rtol=0, atol=0)
        assert_same(f_params, ref_params)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_eps1_none_is_the_machine_epsilon_of_the_params_dtype(dtype):
    """Tiny gradients, where epsilon1 bounds the second moments: None is torch's
    ``finfo(dtype).eps``, for each dtype, and the same as giving that value."""
    base = rand(SHAPES[:3], dtype)
    grads = [rand(SHAPES[:3], dtype, seed=k + 1, scale=1e-9) for k in range(3)]
    for ref_params, our_params, f_params, *_ in three_ways({"eps": (None, 1e-3)}, base, grads):
        assert_same(our_params, ref_params, rtol=0, atol=0)
        assert_same(f_params, ref_params)
    given = fo.adafactor(eps=(torch.finfo(dtype).eps, 1e-3))
    default = fo.adafactor()
    for tx_a, tx_b in [(given, default)]:
        updates_a, _ = tx_a.update(grads[0], tx_a.init(base), base)
        updates_b, _ = tx_b.update(grads[0], tx_b.init(base), base)
        assert_same(updates_a, updates_b, rtol=0, atol=0)
    tiny_eps = fo.adafactor(eps=(1e-30, 1e-3))
    updates_c, _ = tiny_eps.update(grads[0], tiny_eps.init(base), base)
    assert not torch.equal(updates_c[0], updates_a[0])  # epsilon1 bounds them here


def test_complex_params_are_rejected_as_torch_rejects_them():
    p, q = torch.nn.Parameter(torch.randn(2, 3, dtype=torch.complex64)), torch.nn.Parameter(torch.randn(3))
    for cls in (torch.optim.Adafactor, fo.Adafactor):
        opt = cls([p, q])  # accepted at construction, refused at the step
        p.grad, q.grad = torch.randn_like(p), torch.randn_like(q)
        with pytest.raises(RuntimeError, match="^Adafactor does not support complex parameters$"):
            opt.step()
    with pytest.raises(RuntimeError, match="^Adafactor does not support complex parameters$"):
        fo.adafactor().init({"p": p.detach()})


def test_update_needs_the_params():
    params = {"w": torch.randn(3, 2)}
    tx = fo.adafactor()
    with pytest.raises(ValueError, match=r"needs the params.*call update\(grads, state, params\)"):
        tx.update({"w": torch.randn(3, 2)}, tx.init(params))


def test_a_state_made_for_other_params_is_rejected():
    tx = fo.adafactor()
    state = tx.init({"w": torch.randn(3, 2)})
    with pytest.raises(
        ValueError, match=r"gradient of shape \(2, 3\) needs row_var \(2, 1\), col_var \(1, 3\)"
    ):
        tx.update({"w": torch.randn(2, 3)}, state, {"w": torch.randn(2, 3)})
    with pytest.raises(ValueError, match=r"needs row_var none, col_var none, variance \(6,\)"):
        tx.update({"w": torch.randn(6)}, state, {"w": torch.randn(6)})


def test_range_checks_in_torchs_order_and_words():
    for kwargs, message in [
        ({"lr": -1.0}, "Learning rate should be >= 0 but is: -1.0"),
        ({"beta2_decay": 0.5}, "beta2_decay should be <= 0 but is: 0.5"),
        ({"beta2_decay": 0.5, "d": 0.5}, "beta2_decay should be <= 0 but is: 0.5"),
        ({"eps": (-1.0, 1e-3)}, "epsilon1 should be >= 0 but is: -1.0"),
        ({"eps": (None, -1.0)}, "epsilon2 should be >= 0 but is: -1.0"),
        ({"d": 0.5, "weight_decay": -1.0}, "Clipping threshold d should be >= 1 but is: 0.5"),
        ({"weight_decay": -1.0}, "weight_decay should be >= 0 but is: -1.0"),
    ]:
        for make in (
            lambda kwargs=kwargs: torch.optim.Adafactor([torch.nn.Parameter(torch.ones(2))], **kwargs),
            lambda kwargs=kwargs: fo.Adafactor([torch.nn.Parameter(torch.ones(2))], **kwargs),
            lambda kwargs=kwargs: fo.adafactor(**kwargs),
        ):
            with pytest.raises(ValueError, match=f"^{message}$"):
                make()


def loss_fn(params, x, y):
    return (torch.tanh(x @ params["w"] + params["b"]) - y).pow(2).mean()


def problem(seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(4, 3, generator=g, dtype=dtype), "b": torch.randn(3, generator=g, dtype=dtype)}


def test_vmap_over_an_ensemble_equals_a_loop():
    """A stack of models: each member's matrix gets its factored moments, its vector a
    full one, as alone; the per-member RMS and clipping norms stay per member."""
    g = torch.Generator().manual_seed(9)
    x, y = (
        torch.randn(16, 4, generator=g, dtype=torch.float64),
        torch.randn(16, 3, generator=g, dtype=torch.float64),
    )
    inits = [problem(seed) for seed in range(4)]
    stacked = {k: torch.stack([p[k] for p in inits]) for k in inits[0]}
    tx = fo.adafactor(lr=0.05, weight_decay=0.1, d=1.05)

    def run(p):
        adapted, state, _ = fo.inner_loop(loss_fn, p, tx, [(x, y)] * 4)
        return adapted, state

    batched = vmap(run)(stacked)
    for i, p in enumerate(inits):
        member = optree.tree_map(lambda t, i=i: t[i], batched)
        assert_same(
            list(optree.tree_leaves(member)), list(optree.tree_leaves(run(p))), rtol=1e-10, atol=1e-12
        )
    assert batched[1].row_var["w"].shape == (4, 4, 1) and batched[1].variance["b"].shape == (4, 3)


def test_gradient_through_steps_wrt_lr_and_eps2_matches_finite_differences():
    params = problem(0)
    g = torch.Generator().manual_seed(9)
    x, y = (
        torch.randn(16, 4, generator=g, dtype=torch.float64),
        torch.randn(16, 3, generator=g, dtype=torch.float64),
    )

    def f(lr, eps2):
        adapted, _, _ = fo.inner_loop(loss_fn, params, fo.adafactor(lr=lr, eps=(None, eps2)), [(x, y)] * 3)
        return loss_fn(adapted, x, y)

    lr, eps2 = torch.tensor(0.05, dtype=torch.float64), torch.tensor(1.02, dtype=torch.float64)
    d_lr, d_eps2 = grad(f, argnums=(0, 1))(lr, eps2)
    h = 1e-6
    torch.testing.assert_close(d_lr, (f(lr + h, eps2) - f(lr - h, eps2)) / (2 * h), rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(d_eps2, (f(lr, eps2 + h) - f(lr, eps2 - h)) / (2 * h), rtol=1e-5, atol=1e-9)
    assert d_lr.abs() > 0 and d_eps2.abs() > 0
