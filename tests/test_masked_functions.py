"""Inside `fo.masked` and `fo.partition`, an extra argument that is a function of the
params (sam's ``grad_fn``, sophia's ``obj_fn``, a line search's ``value_fn``) gets the
whole params, those outside the mask held at their values; ``grad_fn``'s gradients (and
a line search's ``grad=``) reach the inner transformation masked. The result equals the
inner transformation run on the selected params alone, the others fixed."""

from __future__ import annotations

from typing import Any

import optree
import torch

import funcopt as fo

MASK = {"w": True, "b": False}


def params0() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(3, 2, generator=g, dtype=torch.float64),
        "b": torch.randn(2, generator=g, dtype=torch.float64),
    }


def loss(p: dict[str, Any]) -> torch.Tensor:
    """A loss that couples w and b (so b's value matters to w's gradient)."""
    assert all(isinstance(x, torch.Tensor) for x in optree.tree_leaves(p)), (
        "a function of the params got a hole"
    )
    return ((p["w"] @ p["b"]) ** 2).sum() + (p["w"] ** 4).sum() + (p["b"] ** 2).sum()


def grad_fn(p: dict[str, Any], i: int) -> dict[str, Any]:
    return torch.func.grad(loss)(p)


def sam() -> fo.GradientTransformation:
    return fo.sam(fo.sgd(lr=0.1), fo.chain(fo.normalize(), fo.scale(-0.05)), sync_period=3, opaque_mode=True)


def test_sam_opaque_inside_masked_is_sam_on_the_selected_params():
    tx, ref = fo.masked(sam(), MASK), sam()
    params = params0()
    state, ref_state = tx.init(params), ref.init({"w": params["w"]})
    for _ in range(3):
        grads = grad_fn(params, -1)
        updates, state = tx.update(grads, state, params, grad_fn=grad_fn)
        b = params["b"]
        ref_updates, ref_state = ref.update(
            {"w": grads["w"]},
            ref_state,
            {"w": params["w"]},
            grad_fn=lambda q, i, b=b: {"w": grad_fn({**q, "b": b}, i)["w"]},
        )
        torch.testing.assert_close(updates["w"], ref_updates["w"], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(updates["b"], grads["b"], rtol=0, atol=0)  # passed through
        params = fo.apply_updates(params, updates)


def test_sam_inside_partition_with_grad_fn():
    tx = fo.partition({"sam": sam(), "plain": fo.sgd(lr=0.1)}, {"w": "sam", "b": "plain"})
    params = params0()
    grads = grad_fn(params, -1)
    updates, _ = tx.update(grads, tx.init(params), params, grad_fn=grad_fn)
    ref, _ = fo.masked(sam(), MASK).update(
        grads, fo.masked(sam(), MASK).init(params), params, grad_fn=grad_fn
    )
    torch.testing.assert_close(updates["w"], ref["w"], rtol=0, atol=0)
    torch.testing.assert_close(updates["b"], -0.1 * grads["b"], rtol=0, atol=0)


def test_zoom_linesearch_inside_masked_searches_the_selected_params():
    def make() -> fo.GradientTransformation:
        return fo.chain(fo.sgd(lr=1.0), fo.scale_by_zoom_linesearch(20))

    tx, ref = fo.masked(make(), MASK), make()
    params = params0()
    state, ref_state = tx.init(params), ref.init({"w": params["w"]})
    for _ in range(3):
        grads, value = torch.func.grad_and_value(loss)(params)
        updates, state = tx.update(grads, state, params, value=value, grad=grads, value_fn=loss)
        b = params["b"]
        sub = lambda q, b=b: loss({**q, "b": b})  # noqa: E731
        w = {"w": params["w"]}
        ref_updates, ref_state = ref.update(
            {"w": grads["w"]}, ref_state, w, value=value, grad={"w": grads["w"]}, value_fn=sub
        )
        torch.testing.assert_close(updates["w"], ref_updates["w"], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(updates["b"], grads["b"], rtol=0, atol=0)
        params = fo.apply_updates(params, updates)


def test_sophia_inside_masked_evaluates_whole_params():
    tx = fo.masked(fo.sophia(0.05), MASK)
    params = params0()
    grads = grad_fn(params, -1)
    updates, _ = tx.update(grads, tx.init(params), params, obj_fn=loss)  # loss asserts it gets tensors
    assert torch.isfinite(updates["w"]).all()
    torch.testing.assert_close(updates["b"], grads["b"], rtol=0, atol=0)
